"""Group advantages and the NaN-aware reward mean against hand calculations."""

import math

import numpy as np
import pytest
import torch

from marble.maths.advantages import (
    advantage_correlation,
    combine_advantages,
    group_advantages,
    nan_mean_reward,
    nan_weighted_mean,
)

EPS = 1e-4


def test_group_advantages_1d_with_nan_and_single_sample_group():
    rewards = torch.tensor([1.0, 3.0, 2.0, float("nan"), 5.0], dtype=torch.float64)
    groups = ["a", "a", "b", "b", "c"]
    # valid: 1, 3, 2, 5 -> mean 2.75, population var (3.0625 + .0625 + .5625 + 5.0625) / 4
    std = math.sqrt(8.75 / 4)
    # group means over valid entries: a = 2, b = 2 (its NaN is excluded), c = 5
    expected = [(1 - 2) / (std + EPS), (3 - 2) / (std + EPS), 0.0, float("nan"), 0.0]
    adv = group_advantages(rewards, groups)
    assert adv.shape == rewards.shape and adv.dtype == torch.float64
    torch.testing.assert_close(adv, torch.tensor(expected, dtype=torch.float64), equal_nan=True)


def test_group_advantages_2d_columns_are_independent():
    nan = float("nan")
    rewards = torch.tensor(
        [[1.0, nan], [3.0, 4.0], [2.0, 0.0], [nan, 2.0], [5.0, nan]], dtype=torch.float32
    )
    groups = [7, 7, 8, 8, 9]
    adv = group_advantages(rewards, groups)
    std0 = math.sqrt(8.75 / 4)
    std1 = math.sqrt(8.0 / 3)  # valid 4, 0, 2: mean 2, var (4 + 4 + 0) / 3
    expected = torch.tensor([
        [(1 - 2) / (std0 + EPS), nan],
        [(3 - 2) / (std0 + EPS), 0.0],  # group 7 mean of column 1 is 4 (one valid entry)
        [0.0, (0 - 1) / (std1 + EPS)],
        [nan, (2 - 1) / (std1 + EPS)],
        [0.0, nan],
    ])
    assert adv.dtype == torch.float32
    torch.testing.assert_close(adv, expected, equal_nan=True)


def test_group_advantages_all_nan_column_and_constant_rewards():
    rewards = torch.tensor([[float("nan"), 2.0], [float("nan"), 2.0]])
    adv = group_advantages(rewards, ["p", "q"])
    assert torch.isnan(adv[:, 0]).all()
    # std 0: the eps keeps it finite; equal rewards give exactly 0
    assert torch.equal(adv[:, 1], torch.zeros(2))


def test_group_advantages_matches_numpy_population_std():
    rng = np.random.default_rng(0)
    r = rng.normal(size=12)
    groups = [i // 4 for i in range(12)]
    adv = group_advantages(torch.tensor(r), groups).numpy()
    means = np.array([r[g * 4:(g + 1) * 4].mean() for g in groups])
    np.testing.assert_allclose(adv, (r - means) / (np.std(r) + EPS), rtol=1e-12)


def test_group_advantages_rejects_bad_input():
    with pytest.raises(ValueError, match="group_ids has 2 entries"):
        group_advantages(torch.zeros(3), ["a", "b"])
    with pytest.raises(ValueError, match=r"\[N\] or \[N, K\]"):
        group_advantages(torch.zeros(2, 2, 2), ["a", "b"])


def test_nan_weighted_mean_by_hand():
    nan = float("nan")
    rewards = torch.tensor([[1.0, nan, 3.0], [nan, nan, nan], [2.0, 4.0, 6.0]])
    out = nan_weighted_mean(rewards, [1.0, 2.0, 1.0])
    # row 0: (1 + 3) / 2; row 1: nothing applies -> NaN; row 2: (2 + 8 + 6) / 4
    torch.testing.assert_close(out, torch.tensor([2.0, nan, 4.0]), equal_nan=True)
    torch.testing.assert_close(nan_mean_reward(rewards), torch.tensor([2.0, nan, 4.0]),
                               equal_nan=True)
    with pytest.raises(ValueError, match="weights has 2 entries"):
        nan_weighted_mean(rewards, [1.0, 1.0])


def test_combine_advantages_fills_nan_with_zero():
    adv = torch.tensor([[1.0, float("nan")], [2.0, -4.0]])
    out = combine_advantages(adv, [0.25, 0.75])
    torch.testing.assert_close(out, torch.tensor([0.25, 0.5 - 3.0]))


def test_advantage_correlation_by_hand():
    """combined [1, -1, 1, -1], own [2, NaN, 0, -2]: the three finite pairs (1, 2), (1, 0),
    (-1, -2); centred c = [2/3, 2/3, -4/3], o = [2, 0, -2]; sum co = 4, sum c^2 = 8/3,
    sum o^2 = 8, so r = 4 / sqrt(64/3) = sqrt(3)/2."""
    combined = torch.tensor([1.0, -1.0, 1.0, -1.0])
    own = torch.tensor([2.0, float("nan"), 0.0, -2.0])
    assert advantage_correlation(combined, own) == pytest.approx(math.sqrt(3) / 2, rel=1e-12)
    # the reward's own advantage against itself (MARBLE's per-reward term): 1; negated: -1
    assert advantage_correlation(own, own) == pytest.approx(1.0)
    assert advantage_correlation(-own, own) == pytest.approx(-1.0)
    # scale-free: the weighted sum's 1/K factor does not count as dilution
    assert advantage_correlation(0.25 * combined, own) == pytest.approx(math.sqrt(3) / 2)


def test_advantage_correlation_undefined_cases():
    nan = float("nan")
    assert math.isnan(advantage_correlation([1.0, 2.0, 3.0], [nan, 1.0, nan]))  # one pair
    assert math.isnan(advantage_correlation([1.0, 2.0, 3.0], [0.0, 0.0, 0.0]))  # constant own
    with pytest.raises(ValueError, match="differ in length"):
        advantage_correlation([1.0, 2.0], [1.0, 2.0, 3.0])


def test_epoch_reward_metrics_logs_dilution_per_reward():
    """`dilution/<reward>` in the epoch's metrics: the one-per-sample advantage against each
    reward's own (a generalist equal to it up to scale: 1; the hand case above: sqrt(3)/2)."""
    from marble.training.rollout import epoch_reward_metrics

    avg = torch.tensor([1.0, -1.0, 1.0, -1.0])
    adv = torch.stack([2 * avg, torch.tensor([2.0, float("nan"), 0.0, -2.0])], dim=1)
    rewards = torch.tensor([[0.5, 0.2], [0.1, float("nan")], [0.4, 0.1], [0.2, 0.0]])
    out = epoch_reward_metrics(["gen", "spec"], rewards, ~torch.isnan(rewards), adv, avg)
    assert out["dilution/gen"] == pytest.approx(1.0)
    assert out["dilution/spec"] == pytest.approx(math.sqrt(3) / 2)
    assert out["reward_applicable/spec"] == 3


def test_advantage_slope_by_hand_tells_attenuation_from_opposition():
    """Issue 47: the least-squares slope of the combined advantage on the reward's own over the
    samples where both are finite. By hand: pairs (1, 2), (1, 0), (-1, -2); own mean 0, combined
    mean 1/3; sum (c - 1/3) o = (2/3)(2) + (2/3)(0) + (-4/3)(-2) = 4; sum o^2 = 8; slope 1/2."""
    from marble.maths.advantages import advantage_slope

    combined = torch.tensor([1.0, -1.0, 1.0, -1.0])
    own = torch.tensor([2.0, float("nan"), 0.0, -2.0])
    assert advantage_slope(combined, own) == pytest.approx(0.5, rel=1e-12)
    # not scale-free (unlike the correlation): a 1/4 share of the signal is a 1/4 slope
    assert advantage_slope(0.25 * combined, own) == pytest.approx(0.125, rel=1e-12)
    assert advantage_slope(-combined, own) == pytest.approx(-0.5, rel=1e-12)  # opposed
    assert advantage_slope(own, own) == pytest.approx(1.0)  # carried whole
    assert math.isnan(advantage_slope([1.0, 2.0, 3.0], [0.0, 0.0, 0.0]))  # constant own
    with pytest.raises(ValueError, match="differ in length"):
        advantage_slope([1.0, 2.0], [1.0, 2.0, 3.0])


def test_epoch_reward_metrics_logs_attenuation_per_reward():
    """`attenuation/<reward>` beside `dilution/<reward>`: the hand case above gives 1/2 where
    the correlation gives sqrt(3)/2; a generalist equal to twice the combined advantage: 1/2."""
    from marble.training.rollout import epoch_reward_metrics

    avg = torch.tensor([1.0, -1.0, 1.0, -1.0])
    adv = torch.stack([2 * avg, torch.tensor([2.0, float("nan"), 0.0, -2.0])], dim=1)
    rewards = torch.tensor([[0.5, 0.2], [0.1, float("nan")], [0.4, 0.1], [0.2, 0.0]])
    out = epoch_reward_metrics(["gen", "spec"], rewards, ~torch.isnan(rewards), adv, avg)
    assert out["attenuation/spec"] == pytest.approx(0.5)
    assert out["attenuation/gen"] == pytest.approx(0.5)
