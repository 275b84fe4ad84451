"""Issue 37's question beyond the paper by hand (marble.experiments.claim_beyond): an arm answers
yes only when every measured micro-step's worst cosine is positive, its counted FLOPs without
diagnostics are within 1% of the weighted sum's, and it keeps (a) and (b)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from marble.experiments.claim_beyond import AT_COST, arms_versus_baseline, beyond_sentence
from marble.experiments.claim_experiment import measure_claim_run as measure_run
from marble.report.run_measures import ANGLES, FLAGS, RunMeasure
from marble.experiments.claim_markdown import beyond_frame


def _m(arm, seed, g, s, micro_anti=0.0, micro_min=0.2):
    anti = {k: 0.0 for k in [*FLAGS, "full_solve", "amortized"]}
    return RunMeasure(arm, seed, {"g": g, "s": s}, anti, {a: math.nan for a in ANGLES}, math.nan, 0, 4,
                      {}, {}, micro_anti, micro_min)


def _measures(micro_min_of_seed3=0.2):
    out = []
    for seed in (1, 2, 3):
        out += [_m("weighted_sum", seed, 0.10, 0.01, 0.5, -0.4),
                _m("fresh", seed, 0.10 + 0.01 * seed, 0.03 + 0.001 * seed, 0.0,
                   micro_min_of_seed3 if seed == 3 else 0.2)]
    return out


def test_yes_only_when_positive_at_cost_and_a_and_b_hold():
    costs = {"fresh": {"plain": {"ratio": 1.004}}, "weighted_sum": {"plain": {"ratio": 1.0}}}
    got = arms_versus_baseline(_measures(), ["weighted_sum", "fresh"], "weighted_sum", ["g", "s"],
                               {"s": 0.3}, {"s": 0.001}, 0.4, costs)
    assert list(got) == ["fresh"]  # the baseline is not asked against itself
    part = got["fresh"]
    assert part["positive_every_micro_step"] is True and part["worst_micro_cosine"] == pytest.approx(0.2)
    assert part["a_every_reward_rises"] is True and part["b_specialists_rise_more"] is True
    assert part["at_weighted_sum_cost"] is True and part["answer"] is True
    assert part["micro_anti_aligned"]["mean"] == 0.0
    assert "yes" in beyond_sentence("fresh", part) and "x1.0040" in beyond_sentence("fresh", part)
    frame = beyond_frame({"arms_versus_baseline": got})
    assert isinstance(frame, pd.DataFrame) and frame.loc["fresh", "all four"] == "yes"


@pytest.mark.parametrize("worst, ratio, why", [
    (-0.01, 1.0, "one micro-step of one seed below zero"),
    (0.2, AT_COST + 0.001, "more than 1% over the weighted sum's FLOPs"),
    (0.2, None, "no counted cost"),
])
def test_any_part_failing_is_no(worst, ratio, why):
    costs = {"fresh": {"plain": {"ratio": ratio}}} if ratio is not None else {}
    part = arms_versus_baseline(_measures(worst), ["weighted_sum", "fresh"], "weighted_sum", ["g", "s"],
                                {"s": 0.3}, {"s": 0.001}, 0.4, costs)["fresh"]
    assert part["answer"] is False, why
    assert "no." in beyond_sentence("fresh", part)


def test_micro_step_records_are_read_from_every_weight_source():
    """measure_run reads every `diag_micro` record (fresh solves and cached weights alike)."""
    metrics = pd.DataFrame({
        "step": [1, 2], "anti_aligned": [0.0, 1.0], "cos_min": [0.1, -0.2],
        "diag_micro": [[{"micro": 0, "source": "fresh", "cos_min": 0.3},
                        {"micro": 1, "source": "same_step", "cos_min": -0.05}],
                       [{"micro": 0, "source": "earlier_step", "cos_min": 0.2},
                        {"micro": 1, "source": "same_step", "cos_min": 0.1}]]})
    m = measure_run("x", 1, metrics, [], None)
    assert m.micro_anti_aligned == pytest.approx(0.25) and m.micro_min_cos == pytest.approx(-0.05)
    bare = measure_run("x", 1, metrics.drop(columns="diag_micro"), [], None)
    assert math.isnan(bare.micro_anti_aligned) and math.isnan(bare.micro_min_cos)


def test_a_and_b_follow_the_holm_rule_and_versus_compares_with_both_references():
    """Issue 47 items 2 and 4. Changes g 1.8 / 2.8 / 3.8 and s the same under `fresh`: each
    reward's t-test p is 0.040 (its interval excludes 0), Holm over the 2 rewards 0.080, so (a)
    is undecided where the interval alone said true; (b) has one specialist, its own family.
    `versus` pairs the arm with the weighted sum and with the MARBLE arm, reward by reward."""
    xs = (1.8, 2.8, 3.8)
    ms = []
    for seed, x in zip((1, 2, 3), xs):
        ms += [_m("weighted_sum", seed, 0.0, 0.0, 0.5, -0.4), _m("marble_n5", seed, x - 1.0, x - 1.0),
               _m("fresh", seed, x, x)]
    costs = {"fresh": {"plain": {"ratio": 1.0}}}
    part = arms_versus_baseline(ms, ["weighted_sum", "marble_n5", "fresh"], "weighted_sum", ["g", "s"],
                                {"s": 0.3}, {"s": 0.001}, 0.4, costs, marble_arm="marble_n5")["fresh"]
    assert str(part["a_every_reward_rises"]).startswith("no difference shown after Holm")
    assert part["b_specialists_rise_more"] is True  # one specialist: a family of one, p 0.040
    assert part["answer"] is False
    assert list(part["versus"]) == ["weighted_sum", "marble_n5"]
    p_one = 0.0400  # t = 2.8 / (1 / sqrt 3), 2 degrees of freedom
    assert part["versus"]["weighted_sum"]["g"]["p"] == pytest.approx(p_one, abs=5e-4)
    assert part["versus"]["weighted_sum"]["g"]["p_holm"] == pytest.approx(2 * part["versus"]["weighted_sum"]["g"]["p"])
    # against MARBLE the arm gains exactly 1.0 more on every seed: a zero spread, true
    assert part["versus"]["marble_n5"]["g"]["answer"] is True
