"""marble.report.seed_stats and claim_experiment against hand calculations (issue 26 item 3)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from marble.report import seed_stats as cs
from marble.experiments.claim_experiment import claim_verdict
from marble.experiments.claim_experiment import measure_claim_run as measure_run
from marble.report.run_measures import eval_change
from marble.workflow.claim import arms, parse_run_name, run_name, runs


def test_t_interval_by_hand():
    """[1, 2, 3]: mean 2, sd 1, t(0.975, 2) = 4.3027: 2 +- 4.3027 / sqrt 3 = 2 +- 2.4841."""
    iv = cs.t_interval([1.0, 2.0, 3.0, math.nan])
    assert (iv.mean, iv.sd, iv.n) == (2.0, 1.0, 3)
    assert iv.low == pytest.approx(2 - 2.48414, abs=1e-4)
    assert iv.high == pytest.approx(2 + 2.48414, abs=1e-4)
    assert math.isnan(cs.t_interval([5.0]).low)


def test_an_interval_is_cut_to_the_range_its_quantity_can_take():
    """[0.2, 0.9]: mean 0.55, sd 0.49497, t(0.975, 1) 12.7062 * 0.49497 / sqrt 2 = 4.4471:
    [-3.8971, 4.9971] uncut; a fraction's interval is [0, 1], which decides nothing below 1."""
    free = cs.t_interval([0.2, 0.9])
    assert free.low == pytest.approx(0.55 - 4.4471, abs=1e-3) and free.high == pytest.approx(4.9971, abs=1e-3)
    cut = cs.t_interval([0.2, 0.9], bounds=(0.0, 1.0))
    assert (cut.mean, cut.low, cut.high, cut.sd) == (0.55, 0.0, 1.0, free.sd)
    assert cs.decide(cut) == "no difference larger than 1"  # a low at the bound is not > 0
    inside = cs.t_interval([0.50, 0.52, 0.54], bounds=(0.0, 1.0))
    assert (inside.low, inside.high) == (cs.t_interval([0.50, 0.52, 0.54]).low, cs.t_interval([0.50, 0.52, 0.54]).high)
    assert cs.paired({1: 0.9, 2: 0.1}, {1: 0.1, 2: 0.9}, bounds=(-1.0, 1.0)).high == 1.0


def test_decide_ends_true_false_or_a_bound():
    assert cs.decide(cs.Interval(1, 0.1, 2, 3, 1)) is True
    assert cs.decide(cs.Interval(-1, -2, -0.1, 3, 1)) is False
    assert cs.decide(cs.Interval(0.1, -0.2, 0.5, 3, 1)) == "no difference larger than 0.5"
    assert cs.bound_of("no difference larger than 0.5") == 0.5
    assert cs.all_of([True, "no difference larger than 0.2", "no difference larger than 0.5"]) \
        == "no difference larger than 0.5"
    assert cs.all_of([True, False]) is False and cs.all_of([True, True]) is True


def test_minimal_detectable_difference_and_seeds_by_hand():
    """n = 5, sd = 1: (t(0.975, 4) + t(0.8, 4)) / sqrt 5 = (2.7764 + 0.9410) / 2.2361 = 1.6625."""
    assert cs.minimal_detectable_difference(1.0, 5) == pytest.approx(1.6625, abs=1e-3)
    assert cs.minimal_detectable_difference(1.0, 1) == math.inf
    n = cs.seeds_needed(1.0, 1.6625)
    assert n == 5 and cs.minimal_detectable_difference(1.0, 4) > 1.6625
    assert cs.paired({1: 3.0, 2: 5.0, 3: 1.0}, {1: 1.0, 2: 4.0}).mean == 1.5  # seeds 1, 2 only


def _frame(anti: list, full: list, cos: list) -> pd.DataFrame:
    return pd.DataFrame({"step": range(1, len(anti) + 1), "anti_aligned": anti,
                         "full_solve": full, "cos_min": cos})


def _evals(first: dict[str, float], last: dict[str, float], last_step: int = 8) -> pd.DataFrame:
    """eval.jsonl as read: step 0 and the last step, `eval_reward/<r>` columns."""
    return pd.DataFrame([{"step": 0, **{f"eval_reward/{k}": v for k, v in first.items()}},
                         {"step": last_step, **{f"eval_reward/{k}": v for k, v in last.items()}}])


def test_eval_change_is_the_last_evaluation_minus_step_zero():
    ev = pd.concat([_evals({"a": 0.25}, {"a": 0.5}, 4), _evals({"a": 9.0}, {"a": 1.0})[1:]])
    assert eval_change(ev.reset_index(drop=True), "a") == pytest.approx(0.75)  # steps 0, 4, 8
    assert math.isnan(eval_change(ev, "missing")) and math.isnan(eval_change(None, "a"))
    assert math.isnan(eval_change(ev[1:], "a"))  # no step-0 evaluation: no initial model
    assert math.isnan(eval_change(_evals({"a": math.nan}, {"a": 1.0}), "a"))  # unscorable
    # a run still going (its config says 10 steps, its last evaluation is at 8): no change yet
    assert math.isnan(eval_change(_evals({"a": 0.25}, {"a": 0.5}), "a", final_step=10))
    assert eval_change(_evals({"a": 0.25}, {"a": 0.5}), "a", final_step=8) == pytest.approx(0.25)
    # the two evaluations measured different things (test table or settings changed on resume)
    other = _evals({"a": 0.25}, {"a": 0.5}).assign(eval_id=["0123456789abcdef", "fedcba9876543210"])
    assert math.isnan(eval_change(other, "a"))
    same = other.assign(eval_id=["0123456789abcdef"] * 2)
    assert eval_change(same, "a") == pytest.approx(0.25)


def test_verdict_on_synthetic_runs():
    """MARBLE raises the specialist `s` by 1 more than the weighted sum on every seed; full
    solves have cos_min >= 0; the weighted sum opposes a reward on half its steps."""
    measures = []
    for seed in (1, 2, 3):
        start = {"g": 0.0, "s": 0.1 * seed}  # one initial model per seed, shared by the arms
        ws = _frame([1, 0] * 4, [0] * 8, [-0.2] * 8)
        mb = _frame([0] * 8, [1, 0, 0, 0, 1, 0, 0, 0], [0.3] * 8)
        measures += [measure_run("weighted_sum", seed, ws, ["g", "s"],
                                 _evals(start, {"g": 1.0 + 0.1 * seed, "s": start["s"] + 0.05 * seed})),
                     measure_run("marble_n5", seed, mb, ["g", "s"],
                                 _evals(start, {"g": 1.0 + 0.1 * seed, "s": start["s"] + 1 + 0.05 * seed}))]
    alone = [measure_run("alone_s", seed, _frame([0] * 8, [0] * 8, [0.1] * 8), ["s"],
                         _evals({"s": 0.0}, {"s": 1.0 + seed})) for seed in (1, 2)]
    v = claim_verdict(measures + alone, ["g", "s"], {"s": 0.3}, "marble_n5", "weighted_sum")
    q = v["questions"]
    assert q["b_specialists_rise_more_under_marble"]["per_specialist"]["s"]["answer"] is True
    assert q["b_specialists_rise_more_under_marble"]["per_specialist"]["s"]["difference"]["mean"] \
        == pytest.approx(1.0)
    assert q["c_marble_less_anti_aligned"]["answer"] is True  # 0.5 vs 0 on every seed
    assert q["conflict_weighted_sum_anti_aligned"]["answer"] is True
    assert q["theorem_full_solves_never_anti_aligned"] == {
        "answer": True, "min_cosine": 0.3, "full_solve_steps": 6, "tolerance": 1e-6,
        "arms": ["marble_n5"]}
    # every arm beside the baseline, paired by seed: MARBLE's specialist +1 on every seed
    vs = v["arm_results"]["marble_n5"]["vs_baseline"]["s"]
    assert vs["mean"] == pytest.approx(1.0) and vs["sd"] == pytest.approx(0.0, abs=1e-12)
    assert "vs_baseline" not in v["arm_results"]["weighted_sum"]
    assert q["every_reward_learnable_alone"]["per_reward"]["s"]["change"]["n"] == 2
    assert set(v) >= {"arms", "seeds", "questions", "sentences", "arm_results", "specialists",
                      "change_measure"}
    assert v["arms"] == ["weighted_sum", "marble_n5"] and len(v["sentences"]) == len(q)
    with pytest.raises(ValueError, match="arm 'marble_n1' has no runs"):
        claim_verdict(measures, ["g", "s"], {}, "marble_n1", "weighted_sum")


def test_claim_runs_are_every_arm_times_every_seed():
    section = {"seeds": [1, 2], "max_steps": 4, "set": ["train.lr=0.1"],
               "arms": {"ws": {"preset": "tiny_weighted_sum", "set": []}, "gone": None,
                        "m": {"preset": "tiny", "set": ["balancer.amortize_every=2"], "max_steps": 2}},
               "alone": {"preset": "tiny_weighted_sum", "seeds": [7], "rewards": ["toy_brightness", "toy_color_match"],
                         "sources": {"toy_color_match": ["geneval"]}}}
    assert list(arms(section)) == ["ws", "m"]
    r = runs(section)
    assert list(r) == ["ws-s1", "ws-s2", "m-s1", "m-s2", "alone_toy_brightness-s7", "alone_toy_color_match-s7"]
    # a specialist alone trains on its own sources: one stage of the run's steps over them
    assert r["alone_toy_color_match-s7"]["set"][-2:] == [
        "stages=[{name: toy_color_match, steps: 4, sources: [geneval]}]", "train.seed=7"]
    # evaluated at step 0 and at the last step: the claim's change is the difference
    assert r["m-s2"] == {"preset": "tiny", "max_steps": 2,
                         "set": ["train.eval_every=2", "train.lr=0.1", "balancer.amortize_every=2",
                                 "train.seed=2"]}
    assert r["ws-s1"]["set"][0] == "train.eval_every=4"
    assert r["alone_toy_brightness-s7"]["set"][-2:] == ["rewards=[{name: toy_brightness}]",
                                                       "train.seed=7"]
    assert parse_run_name(run_name("marble_n5_ema0", 12)) == ("marble_n5_ema0", 12)
    with pytest.raises(ValueError, match="not <arm>-s<seed>"):
        parse_run_name("weighted_sum")


def test_two_seeds_that_agree_by_chance_keep_the_fractions_sampling_error():
    """Weighted sum 60% and MARBLE 50% of 30 diagnostic steps on both seeds: the paired sd is
    0, but each fraction has its own sampling error (Jeffreys: (18.5/31, 15.5/31) ->
    se 0.08956, 0.09129; paired floor hypot = 0.12788), so the answer is a bound, not `true`
    on a zero-width interval: 0.1 +- t(0.975, 1) 0.12788 / sqrt 2 = 0.1 +- 1.1490, cut to
    [-1, 1], the range a difference of two fractions can take."""
    from marble.report.run_measures import RunMeasure, question_c

    def run(arm, seed, f):
        return RunMeasure(arm, seed, {}, {"applied": f}, {}, math.nan, 0, 30)

    measures = [run("ws", s, 0.6) for s in (1, 2)] + [run("m", s, 0.5) for s in (1, 2)]
    q = question_c(measures, "m", "ws", effect=0.4)
    assert q["difference"]["sd"] == pytest.approx(0.12788, abs=1e-4)
    assert (q["difference"]["low"], q["difference"]["high"]) == (-1.0, 1.0)  # 0.1 -+ 1.1490 cut
    assert q["answer"] == "no difference larger than 1" and q["powered"] is False
    assert cs.fraction_se(0.0, 30) > 0 and math.isnan(cs.fraction_se(0.5, 0))


def test_a_runs_cpu_seconds_come_from_its_summary_before_the_sampled_benchmark(tmp_path):
    from marble.experiments.claim_cli import cpu_seconds

    (tmp_path / "r-s1.tsv").write_text("s\tcpu_time\n35.0\t13.0\n")
    assert cpu_seconds({"cpu_time_s": 38.5}, tmp_path, "r-s1") == 38.5
    assert cpu_seconds({}, tmp_path, "r-s1") == 13.0  # an older run: the benchmark's sample
    assert math.isnan(cpu_seconds({}, tmp_path, "other"))


def test_alone_sources_of_a_reward_not_trained_alone_is_an_error_naming_it():
    section = {"seeds": [1, 2], "max_steps": 4, "arms": {},
               "alone": {"seeds": [1], "rewards": ["toy_color_match"],
                         "sources": {"toy_colour_match": ["geneval"]}}}  # misspelt
    with pytest.raises(ValueError, match=r"claim.alone.sources.toy_colour_match: not among"):
        runs(section)


def test_the_theorem_is_asked_of_min_norm_arms_and_learnability_only_with_alone_arms():
    """A zoo weighting that is not min-norm (UPGrad, random, ...) may oppose a reward on its own
    solve: the theorem is about MARBLE's and MGDA's; a zoo without alone arms asks no
    learnability question (it was answered 'no difference larger than inf')."""
    def run(arm, seed, cos):
        diag = pd.DataFrame({"step": [1, 2], "anti_aligned": [0, 1], "full_solve": [1, 0],
                             "cos_min": [cos, -0.5]})
        return measure_run(arm, seed, diag, ["g"], _evals({"g": 0.0}, {"g": 1.0}))

    measures = [run(a, s, c) for s in (1, 2) for a, c in
                (("weighted_sum", 0.1), ("marble", 0.2), ("zoo_random", -0.3))]
    every = claim_verdict(measures, ["g"], {}, "marble", "weighted_sum")
    assert every["questions"]["theorem_full_solves_never_anti_aligned"]["answer"] is False
    v = claim_verdict(measures, ["g"], {}, "marble", "weighted_sum", min_norm_arms={"marble"})
    t = v["questions"]["theorem_full_solves_never_anti_aligned"]
    assert t["answer"] is True and t["arms"] == ["marble"] and t["full_solve_steps"] == 2
    assert "every_reward_learnable_alone" not in v["questions"]
    assert len(v["sentences"]) == len(v["questions"]) == 5


def test_an_arms_fractions_keep_each_runs_sampling_error_over_the_steps_they_count():
    """Three seeds at 20 of 30 steps each (a full solve on 6 of them, never anti-aligned): the
    seeds' sd is 0, the floor is each run's Jeffreys error: applied p = 20.5/31 over 30 steps
    -> se 0.086407, t(0.975, 2) 4.3027 x 0.086407 / sqrt 3 = 0.21465; full solve p = 0.5/7
    over 6 steps -> se 0.10514, half-width 0.26119, its low end cut to 0."""
    from marble.report.run_measures import ANGLES, RunMeasure, arm_table

    anti = {"applied": 20 / 30, "full_solve": 0.0, "amortized": 20 / 24}
    angles = dict.fromkeys(ANGLES, math.nan)  # as measure_run records a run without angles
    measures = [RunMeasure("m", s, {}, anti, angles, 0.1, 6, 30) for s in (1, 2, 3)]
    table = arm_table(measures, [])["m"]["anti_aligned"]
    assert table["applied"].sd == pytest.approx(0.086407, abs=1e-5)
    assert table["applied"].low == pytest.approx(20 / 30 - 0.21465, abs=1e-4)
    assert table["applied"].high == pytest.approx(20 / 30 + 0.21465, abs=1e-4)
    assert table["full_solve"].sd == pytest.approx(0.10514, abs=1e-5)
    assert table["full_solve"].low == 0.0 and table["full_solve"].high == pytest.approx(0.26119, abs=1e-4)
