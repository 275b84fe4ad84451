"""Advantage-level balancers: the weighted-sum step on another one-per-sample advantage.

`gdpo` and `reward_sum` need no gradient of any reward: the rollout computes their
advantage (marble.maths.advantage_balancers) in place of the weighted mean reward's, and
the step is the weighted sum's single backward on it (`WeightedSum`, unchanged).
"""

from __future__ import annotations

from marble.balancers.strategies import WeightedSum

__all__ = ["GDPO", "RewardSum", "ADVANTAGE_LEVEL"]


class GDPO(WeightedSum):
    """GDPO (arXiv 2601.05242): per-reward group normalisation, sum, batch normalisation."""

    method = "gdpo"


class RewardSum(WeightedSum):
    """MixGRPO's multi-reward advantage: the plain sum of the per-reward group advantages."""

    method = "reward_sum"


ADVANTAGE_LEVEL = (GDPO.method, RewardSum.method)
