"""A reward added the documented way (docs/ARCHITECTURE.md, "Add a reward"): its scorer module
and its descriptor, nothing else. tests/test_add_a_reward.py registers it and runs the doctor,
the cost model, the FLOPs bench, a tiny training and an evaluation with it."""

from __future__ import annotations

from marble.rewards import RewardDescriptor
from marble.rewards.base import Reward

NAME = "probe_redness"


class Redness(Reward):
    """Mean red minus mean blue, in [-1, 1]; every prompt."""

    name = NAME

    def score(self, images, prompts, metadata):
        return (images[:, 0] - images[:, 2]).flatten(1).mean(dim=1).float()


DESCRIPTOR = RewardDescriptor(
    NAME, f"{__name__}:Redness",
    flops=7.0e6,  # stated for the test: 7 MFLOP an image, so the plan's term is checkable
    modules=("json",),  # a module the doctor finds (its check runs on the descriptor's list)
    doctor_rows=("build",),  # cheap: the doctor builds it
)
