"""Issue 47 item 4 by hand: one decision rule (Holm within each question's family), replication
only when both halves decide, and the verdict's answers read from that rule."""

from __future__ import annotations

import math

import pytest

from marble.experiments import claim_rule as rule
from marble.experiments.claim_experiment import claim_verdict
from marble.report.run_measures import ANGLES, FLAGS, RunMeasure

# df = 2: P(|T| > t) = 1 - t / sqrt(t^2 + 2). [1.8, 2.8, 3.8]: mean 2.8, sd 1, t = 2.8 sqrt 3
T_BORDER = 2.8 * math.sqrt(3)
P_BORDER = 1 - T_BORDER / math.sqrt(T_BORDER**2 + 2)  # 0.0400: the 95% interval excludes 0


def test_t_pvalue_with_the_intervals_sd_floor_by_hand():
    assert rule.t_pvalue_floor([1, 2, 3]) == pytest.approx(1 - math.sqrt(12) / math.sqrt(14))
    # floor 2 > sd 1: t = 2 / (2 / sqrt 3) = sqrt 3
    assert rule.t_pvalue_floor([1, 2, 3], sd_floor=2.0) == pytest.approx(1 - math.sqrt(3) / math.sqrt(5))
    assert math.isnan(rule.t_pvalue_floor([1.0])) and rule.t_pvalue_floor([2.0, 2.0]) == 0.0


def test_two_borderline_members_are_undecided_after_holm():
    """Each member alone has p = 0.040 (its interval excludes 0); Holm over two: 0.080, so
    neither is decided: the learnability gate text contrast passed only unadjusted."""
    assert P_BORDER == pytest.approx(0.0400, abs=1e-4)
    fam = rule.holm_family({"g": [1.8, 2.8, 3.8], "s": [1.8, 2.8, 3.8]})
    assert fam["g"]["p"] == pytest.approx(P_BORDER) and fam["s"]["p_holm"] == pytest.approx(2 * P_BORDER)
    assert fam["g"]["answer"].startswith("no difference shown after Holm")
    assert rule.every([m["answer"] for m in fam.values()]).startswith("no difference shown")
    alone = rule.holm_family({"g": [1.8, 2.8, 3.8]})  # a family of one: its own test
    assert alone["g"]["answer"] is True
    assert rule.every([True, False]) is False and rule.every([True, True]) is True


def test_replication_needs_both_halves_to_decide_alike():
    assert rule.replication_status(True, True) == rule.REPLICATED
    assert rule.replication_status(False, False) == rule.REPLICATED
    assert rule.replication_status("no difference shown", "no difference larger than 1") == rule.UNDECIDED
    assert rule.replication_status(True, "no difference shown") == rule.NOT_REPLICATED
    assert rule.replication_status(True, False) == rule.NOT_REPLICATED
    assert rule.overall_replication([rule.REPLICATED, rule.UNDECIDED]) == rule.UNDECIDED
    assert rule.overall_replication([rule.REPLICATED, rule.NOT_REPLICATED]) == rule.NOT_REPLICATED
    assert rule.overall_replication([rule.REPLICATED]) == rule.REPLICATED


def _run(arm, seed, changes):
    anti = {k: 0.0 for k in [*FLAGS, "full_solve", "amortized"]}
    return RunMeasure(arm, seed, changes, anti, {a: math.nan for a in ANGLES}, math.nan, 0, 4)


def test_the_verdicts_answers_come_from_the_holm_families():
    """Two rewards learnable alone at p = 0.040 each: the interval says true for each, the rule
    (Holm over the two) says neither is shown; (a)'s members likewise; the family is named."""
    xs = [1.8, 2.8, 3.8]
    ms = [_run(a, s + 1, {"g": xs[s], "s": xs[s]}) for s in range(3) for a in ("weighted_sum", "marble")]
    ms += [_run(f"alone_{r}", s + 1, {r: xs[s]}) for s in range(3) for r in ("g", "s")]
    q = claim_verdict(ms, ["g", "s"], {"s": 0.3}, "marble", "weighted_sum")["questions"]
    learn = q["every_reward_learnable_alone"]
    assert learn["per_reward"]["g"]["change"]["low"] > 0  # the interval alone would say true
    assert learn["per_reward"]["g"]["answer"].startswith("no difference shown after Holm")
    assert learn["answer"].startswith("no difference shown after Holm")
    assert learn["holm"]["members"]["s"]["p_holm"] == pytest.approx(2 * P_BORDER)
    assert learn["holm"]["family"] == rule.FAMILIES["every_reward_learnable_alone"]
    assert q["a_every_reward_rises_under_marble"]["per_reward"]["g"].startswith("no difference shown")
    assert "holm" not in q["theorem_full_solves_never_anti_aligned"]  # a bound, not a test
