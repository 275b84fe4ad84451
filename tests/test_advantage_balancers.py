"""GDPO and the per-reward advantage sum against hand calculations, NaN masks included."""

from __future__ import annotations

import math

import pytest
import torch

from marble.maths.advantage_balancers import gdpo_advantages, reward_sum_advantages
from marble.training.rollout import compute_advantages

NAN = float("nan")


def test_gdpo_by_hand():
    # two groups of two; reward b applies to group "p" only
    rewards = [[1.0, 0.0], [3.0, 2.0], [2.0, NAN], [2.0, NAN]]
    adv = gdpo_advantages(rewards, ["p", "p", "q", "q"])
    # group p: a = 1, 3 -> mean 2, sample std sqrt(2); b = 0, 2 -> mean 1, std sqrt(2)
    z = 1 / (math.sqrt(2) + 1e-4)
    # group q: a = 2, 2 -> std 0 -> 0; b does not apply
    s = [-2 * z, 2 * z, 0.0, 0.0]
    mean, std = 0.0, math.sqrt(sum(v * v for v in s) / 3)
    want = [(v - mean) / (std + 1e-4) for v in s]
    assert adv.tolist() == pytest.approx(want, rel=1e-12)


def test_gdpo_masks_a_row_no_reward_applies_to_and_weights_the_sum():
    rewards = [[1.0, 5.0], [2.0, 7.0], [NAN, NAN]]
    adv = gdpo_advantages(rewards, [0, 0, 0], weights=[1.0, 0.5])
    assert math.isnan(adv[2])
    z = 1 / (math.sqrt(0.5) + 1e-4)  # a: 1, 2 -> std sqrt(0.5); b: 5, 7 -> std sqrt(2)
    zb = 1 / (math.sqrt(2) + 1e-4)
    s = [-0.5 * z - 0.5 * zb, 0.5 * z + 0.5 * zb]
    std = math.sqrt((s[0] ** 2 + s[1] ** 2) / 1)
    assert adv[:2].tolist() == pytest.approx([s[0] / (std + 1e-4), s[1] / (std + 1e-4)])


def test_reward_sum_is_the_nan_aware_sum_of_group_advantages():
    rewards = [[1.0, 0.0], [3.0, NAN], [NAN, NAN]]
    adv = reward_sum_advantages(rewards, [0, 0, 0])
    # a: 1, 3 -> group mean 2, population std 1 -> -1/(1+1e-4), +1/(1+1e-4); b: one value -> 0
    assert adv[0].item() == pytest.approx(-1 / (1 + 1e-4) + 0.0)
    assert adv[1].item() == pytest.approx(1 / (1 + 1e-4))
    assert math.isnan(adv[2])


def test_the_rollout_hands_the_balancer_its_advantage():
    rewards = torch.tensor([[1.0, 0.0], [3.0, 2.0], [2.0, NAN], [2.0, NAN]])
    groups = torch.tensor([0, 0, 1, 1])
    _, gdpo = compute_advantages(rewards, groups, [1.0, 1.0], "gdpo")
    _, plain = compute_advantages(rewards, groups, [1.0, 1.0], "weighted_sum")
    assert torch.equal(gdpo, gdpo_advantages(rewards, [0, 0, 1, 1]).float())
    assert not torch.equal(gdpo, plain)
