"""The three cosine levels' maths (marble/balancers/levels.py) against hand calculations."""

import math

import pytest
import torch

from marble.balancers.levels import (
    StepLevels,
    anti_aligned_fraction,
    level_cosines,
    sum_into,
    weight_source,
)

NAMES = ["a", "b"]


def test_anti_aligned_fraction_counts_negative_minima_and_skips_nan():
    assert anti_aligned_fraction([0.3, -0.1, float("nan"), -0.5]) == (2 / 3, 3)
    assert anti_aligned_fraction([0.0, 0.2]) == (0.0, 2)  # 0 is not anti-aligned
    frac, n = anti_aligned_fraction([float("nan")])
    assert math.isnan(frac) and n == 0


def test_weight_source_names_where_the_weights_came_from():
    assert weight_source(True, None, 4, True) == "fresh"
    assert weight_source(False, 4, 4, True) == "same_step"
    assert weight_source(False, 2, 4, True) == "earlier_step"
    assert weight_source(False, None, 4, False) == "fixed"
    assert weight_source(False, 3, 4, False) == "fixed"


def test_sum_into_is_float64_and_accumulates():
    total = sum_into(None, torch.tensor([1.0, 2.0]))
    total = sum_into(total, torch.tensor([0.5, -4.0]))
    assert total.dtype == torch.float64 and total.tolist() == [1.5, -2.0]


def test_level_cosines_by_hand_nan_for_an_absent_reward():
    d = torch.tensor([1.0, 0.0], dtype=torch.float64)
    g = [torch.tensor([1.0, 1.0], dtype=torch.float64), None,
         torch.tensor([-2.0, 0.0], dtype=torch.float64)]
    cos = level_cosines(d, g).tolist()
    assert cos[0] == pytest.approx(1 / math.sqrt(2)) and math.isnan(cos[1])
    assert cos[2] == pytest.approx(-1.0)


def test_step_level_sums_micro_steps_before_the_cosine():
    """Two micro-steps whose own cosines are both anti-aligned for one reward, while the
    summed step is aligned: the levels differ, and each is computed by hand."""
    lv = StepLevels(NAMES, global_step=3)
    valid = torch.tensor([True, True])
    # micro 0: d = (1, 0), g_a = (1, 0), g_b = (-1, 3): cos_b = -1/sqrt(10) < 0
    lv.add_micro(0, "fresh", torch.tensor([1.0, 0.0]), [torch.tensor([1.0, 0.0]),
                 torch.tensor([-1.0, 3.0])], valid, torch.tensor(-1 / math.sqrt(10)))
    # micro 1: d = (0, 1), g_a = (3, -1), g_b = (0, 1): cos_a = -1/sqrt(10) < 0
    lv.add_micro(1, "same_step", torch.tensor([0.0, 1.0]), [torch.tensor([3.0, -1.0]),
                 torch.tensor([0.0, 1.0])], valid, torch.tensor(-1 / math.sqrt(10)))
    # step: D = (1, 1), G_a = (4, -1), G_b = (-1, 4): cos = 3 / (sqrt 2 sqrt 17) each
    update = torch.tensor([1.0, -1.0], dtype=torch.float64)  # cos_a = 5/sqrt(34), cos_b = -5/sqrt(34)
    out = lv.result(update)
    step_cos = 3 / (math.sqrt(2) * math.sqrt(17))
    assert out["cos_step/a"] == pytest.approx(step_cos) and out["cos_step/b"] == pytest.approx(step_cos)
    assert out["cos_step_min"] == pytest.approx(step_cos) and out["cos_step_var"] == pytest.approx(0.0)
    assert out["anti_aligned_step"] == 0.0
    assert out["cos_update/a"] == pytest.approx(5 / math.sqrt(34))
    assert out["cos_update/b"] == pytest.approx(-5 / math.sqrt(34))
    assert out["cos_update_var"] == pytest.approx((5 / math.sqrt(34)) ** 2)
    assert out["anti_aligned_update"] == 1.0
    assert out["diag_micro_steps"] == 2 and out["anti_aligned_micro"] == 1.0
    assert out["diag_micro_steps_fresh"] == 1 and out["anti_aligned_micro_same_step"] == 1.0
    assert [r["source"] for r in out["diag_micro"]] == ["fresh", "same_step"]
    assert [r["micro"] for r in out["diag_micro"]] == [0, 1]


def test_an_invalid_reward_adds_nothing_and_a_skipped_update_is_nan():
    lv = StepLevels(NAMES, global_step=0)
    lv.add_micro(0, "fixed", torch.tensor([1.0, 0.0]),
                 [torch.tensor([1.0, 0.0]), torch.tensor([-5.0, 0.0])],
                 torch.tensor([True, False]), torch.tensor(1.0))
    out = lv.result(torch.zeros(2, dtype=torch.float64))
    assert out["cos_step/a"] == pytest.approx(1.0) and math.isnan(out["cos_step/b"])
    assert out["anti_aligned_step"] == 0.0  # b's gradient was invalid, not opposed
    assert math.isnan(out["anti_aligned_update"]) and math.isnan(out["cos_update/a"])
    assert out["anti_aligned_micro"] == 0.0 and out["diag_micro_steps_fixed"] == 1
    with pytest.raises(ValueError, match="weight source"):
        lv.add_micro(1, "stale", torch.zeros(2), [torch.zeros(2)] * 2, torch.tensor([True] * 2), 0.0)


def test_output_space_micro_steps_are_labelled_fresh():
    """Issue 47 item 6: every micro-step of `gram_space: output` is its own output-space solve,
    so its weight source is `fresh`, never `fixed`; the parameter-space cached MARBLE's
    amortized micro-step before any solve stays `fixed`."""
    from marble.balancers import build_balancer
    from marble.config import BalancerConfig

    out = build_balancer(BalancerConfig(method="marble", gram_space="output"), ["a", "b"])
    cached = build_balancer(BalancerConfig(method="marble"), ["a", "b"])
    assert out.micro_source(False, 3) == "fresh"
    assert cached.micro_source(False, 3) == "fixed" and cached.micro_source(True, 3) == "fresh"
