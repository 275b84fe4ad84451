"""Issue 36 items 2 and 4 by hand: Holm, TOST, the seed halves, the pilot, the verdict's
`levels`, `multiplicity` and `replication` (marble.report.seed_stats / claim_design /
claim_levels)."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
from scipy import stats

from marble.experiments import claim_family as fam
from marble.report import seed_stats as cs
from marble.experiments.claim_design import (NO_PILOT, load_pilot, multiplicity, pilot_effects,
                                        pilot_section, replication)
from marble.experiments.claim_experiment import claim_verdict
from marble.experiments.claim_experiment import measure_claim_run as measure_run
from marble.report.run_measures import ANGLES, FLAGS, RunMeasure
from marble.experiments.claim_levels import PAPER_QUANTITY, levels_verdict, run_levels
from marble.experiments.claim_rule import SECTION_FAMILIES


def test_holm_by_hand_and_nan_out_of_the_family():
    # sorted .01, .03, .04: x3 = .03, x2 = .06, x1 = .04 -> monotone .06
    adj = fam.holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": math.nan})
    assert adj["a"] == pytest.approx(0.03) and adj["c"] == pytest.approx(0.06)
    assert adj["b"] == pytest.approx(0.06) and math.isnan(adj["d"])
    assert fam.holm({"x": 0.6, "y": 0.7}) == {"x": 1.0, "y": 1.0}  # capped at 1


def test_t_pvalue_and_tost_by_hand():
    # df = 2: P(|T| > t) = 1 - t / sqrt(t^2 + 2); [1, 2, 3]: t = 2 / (1 / sqrt 3) = sqrt 12
    assert fam.t_pvalue([1, 2, 3]) == pytest.approx(1 - math.sqrt(12) / math.sqrt(14))
    assert math.isnan(fam.t_pvalue([1.0]))
    # TOST of [0.1, -0.1, 0]: mean 0, se 0.1 / sqrt 3; margin 1: t = 1 / se = sqrt 300,
    # one-sided p = (1 - t / sqrt(t^2 + 2)) / 2 on each side
    assert fam.tost([0.1, -0.1, 0.0], 1.0) == pytest.approx((1 - math.sqrt(300 / 302)) / 2)
    t = 0.05 / (0.1 / math.sqrt(3))
    assert fam.tost([0.1, -0.1, 0.0], 0.05) == pytest.approx((1 - t / math.sqrt(t * t + 2)) / 2)
    assert fam.tost([0.1, -0.1, 0.0], 0.05) > 0.05  # an interval around 0 is not equivalence
    assert math.isnan(fam.tost([0.1, 0.2], math.nan))


def test_adjusted_answers_halves_and_answer_kinds():
    assert fam.adjusted_answer(0.3, 0.01) is True and fam.adjusted_answer(-0.3, 0.01) is False
    assert fam.adjusted_answer(0.3, 0.2).startswith("no difference shown after Holm")
    assert fam.halves([5, 1, 3, 2]) == ([1, 2], [3, 5])
    assert fam.halves([1, 2, 3, 4, 5]) == ([1, 2], [3, 4])
    assert fam.answer_kind("no difference larger than 0.3") == fam.answer_kind("no difference shown")
    assert fam.answer_kind(True) != fam.answer_kind(False)


def test_pilot_power_uses_the_pilots_sd_and_no_file_says_no_pilot(tmp_path):
    got = fam.pilot_powered([0.0, 2.0], 10, 5.0)  # sd sqrt 2
    assert got["pilot_sd"] == pytest.approx(math.sqrt(2)) and got["pilot_seeds"] == 2
    assert got["minimal_detectable_difference"] == pytest.approx(
        cs.minimal_detectable_difference(math.sqrt(2), 10))
    assert got["powered"] is True and fam.pilot_powered([0.0, 2.0], 3, 0.1)["powered"] is False
    assert pilot_section(load_pilot(tmp_path / "absent.json"), 4) == NO_PILOT
    path = tmp_path / "claim_pilot.json"
    path.write_text(json.dumps({"commit": "abc123", "questions": {
        "b": {"s": {"per_seed": [0.0, 2.0], "effect_of_interest": 5.0}}}}))
    sec = pilot_section(load_pilot(path), 10)
    assert sec["commit"] == "abc123" and sec["questions"]["b"]["s"]["powered"] is True
    path.write_text("{}")
    with pytest.raises(ValueError, match="claim_pilot.json: not a claim pilot"):
        load_pilot(path)


def _measure(arm, seed, change_g, change_s, levels=None):
    anti = {k: 0.0 for k in [*FLAGS, "full_solve", "amortized"]}
    return RunMeasure(arm, seed, {"g": change_g, "s": change_s}, anti, {a: math.nan for a in ANGLES},
                      math.nan, 0, 4, levels or {})


def test_multiplicity_holm_families_and_equivalence_only_from_tost():
    # MARBLE minus weighted sum on s: [0.01, -0.01, 0.0, 0.005] (tiny); margin = 0.5 x alone 1.0
    diffs = [0.01, -0.01, 0.0, 0.005]
    ms = []
    for i, seed in enumerate((1, 2, 3, 4)):
        ms += [_measure("weighted_sum", seed, 1.0, 0.2), _measure("marble", seed, 1.0 + seed, 0.2 + diffs[i]),
               RunMeasure("alone_s", seed, {"s": 1.0 + 0.1 * seed}, {}, {}, math.nan, 0, 0)]
    m = multiplicity(ms, ["g", "s"], {"s": 0.3}, "marble", "weighted_sum", 0.5)
    a = m["families"]["a_every_reward_rises_under_marble"]
    # (a) g: [2, 3, 4, 5]: p = 2 P(T3 > 3.5 / (1.29099 / 2)); two members -> Holm x2 or monotone
    assert a["g"]["p"] == pytest.approx(fam.t_pvalue([2, 3, 4, 5]))
    # s's changes 0.21, 0.19, 0.2, 0.205 have the smaller p: Holm doubles it, g keeps max(own, that)
    p_g, p_s = a["g"]["p"], a["s"]["p"]
    assert p_s < p_g and a["s"]["p_holm"] == pytest.approx(2 * p_s)
    assert a["g"]["p_holm"] == pytest.approx(max(p_g, 2 * p_s)) and a["g"]["answer"] is True
    eq = m["b_equivalence"]["s"]
    assert eq["margin"] == pytest.approx(0.5 * 1.25)  # half the mean change alone
    assert eq["p_tost"] == pytest.approx(fam.tost(diffs, 0.625)) and eq["equivalent"] is True
    b = m["families"]["b_specialists_rise_more_under_marble"]["s"]
    assert b["answer"].startswith("no difference shown")  # not a match: the TOST says that
    assert "learnable" in " ".join(m["families"])


def test_the_pilot_fixes_bs_effect_of_interest_before_the_run():
    """Issue 36 item 4: (b)'s effect of interest in absolute units comes from the committed
    pilot, not from the main run's own alone arms (before, the verdict always took half of this
    run's alone change, so "powered" and the TOST margin were decided after the data)."""
    diffs = [0.01, -0.01, 0.0, 0.005]
    ms = []
    for i, seed in enumerate((1, 2, 3, 4)):
        ms += [_measure("weighted_sum", seed, 1.0, 0.2), _measure("marble", seed, 1.0 + seed, 0.2 + diffs[i]),
               RunMeasure("alone_s", seed, {"s": 1.0 + 0.1 * seed}, {}, {}, math.nan, 0, 0)]
    pilot = {"commit": "abc", "questions": {"b_specialists_rise_more_under_marble": {
        "s": {"per_seed": [0.0, 0.01], "effect_of_interest": 0.002}}}}
    fixed = pilot_effects(pilot, "marble")
    assert fixed == {"s": 0.002} and pilot_effects(pilot, "other") is None and pilot_effects(None, "m") is None
    v = claim_verdict(ms, ["g", "s"], {"s": 0.3}, "marble", "weighted_sum", 0.5, fixed_effects=fixed)
    b = v["questions"]["b_specialists_rise_more_under_marble"]["per_specialist"]["s"]
    assert b["effect_of_interest"] == pytest.approx(0.002) and b["powered"] is False
    assert v["effect_of_interest_source"].startswith("the committed pilot")
    own = claim_verdict(ms, ["g", "s"], {"s": 0.3}, "marble", "weighted_sum", 0.5)
    assert own["questions"]["b_specialists_rise_more_under_marble"]["per_specialist"]["s"][
        "effect_of_interest"] == pytest.approx(0.625) and own["effect_of_interest_source"].endswith("(observed)")
    eq = multiplicity(ms, ["g", "s"], {"s": 0.3}, "marble", "weighted_sum", 0.5, fixed)["b_equivalence"]["s"]
    assert eq["margin"] == pytest.approx(0.002) and eq["equivalent"] is False  # 0.625 made it equivalent
    halves = replication(ms, ["g", "s"], {"s": 0.3}, "marble", "weighted_sum", fixed_effects=fixed)
    assert halves["seed_sets"] == [[1, 2], [3, 4]]


def test_replication_compares_the_verdicts_of_two_seed_halves():
    """Seeds 1, 2: MARBLE's specialist +1 over the weighted sum; seeds 3, 4: -1. Each half
    answers (b) with the opposite sign: not replicated, said as such."""
    ms = []
    for seed, d in ((1, 1.0), (2, 1.1), (3, -1.0), (4, -1.1)):
        ms += [_measure("weighted_sum", seed, 1.0, 0.2), _measure("marble", seed, 1.0, 0.2 + d)]
    r = replication(ms, ["g", "s"], {"s": 0.3}, "marble", "weighted_sum")
    assert r["seed_sets"] == [[1, 2], [3, 4]]
    assert r["questions"]["b_specialists_rise_more_under_marble"]["answers"] == [True, False]
    assert r["questions"]["b_specialists_rise_more_under_marble"]["status"] == "not replicated"
    assert r["status"] == "not replicated"
    few = replication(ms[:4], ["g", "s"], {"s": 0.3}, "marble", "weighted_sum")
    assert few["status"] == "not computable"


def test_replication_with_alone_arms_on_fewer_seeds_than_the_claim_arms():
    """The claim's design: alone arms on seeds 1-2, claim arms on 1-4. The halves split the
    claim arms' seeds; both read every alone run (the effects of interest), and learnability
    is named as not split (the real claim's verdict stopped with KeyError on the second half)."""
    ms = []
    for seed, d in ((1, 1.0), (2, 1.05), (3, 1.05), (4, 1.0)):
        ms += [_measure("weighted_sum", seed, 1.0, 0.2), _measure("marble", seed, 1.5, 0.2 + d)]
    ms += [RunMeasure("alone_s", seed, {"s": 1.0 + 0.1 * seed}, {}, {}, math.nan, 0, 0) for seed in (1, 2)]
    r = replication(ms, ["g", "s"], {"s": 0.3}, "marble", "weighted_sum")
    assert r["seed_sets"] == [[1, 2], [3, 4]]
    learn = r["questions"]["every_reward_learnable_alone"]
    assert learn["status"].startswith("not split") and learn["answers"][0] == learn["answers"][1]
    assert r["questions"]["b_specialists_rise_more_under_marble"]["answers"] == [True, True]
    # issue 47: (b) decided the same way in both halves is replicated; (c), undecided in both,
    # is no agreement, so the verdict's word is "undecided in the halves", not "replicated"
    assert r["questions"]["b_specialists_rise_more_under_marble"]["status"] == "replicated"
    assert r["questions"]["c_marble_less_anti_aligned"]["status"] == "undecided in the halves"
    assert r["status"] == "undecided in the halves"


def test_levels_side_by_side_with_the_paper():
    frame = pd.DataFrame({"anti_aligned": [0.5, 0.25], "cos_min": [-0.1, 0.1], "cos_var": [0.2, 0.2],
                          "anti_aligned_solve": [0.0, 0.0], "cos_solve_min": [0.4, 0.36],
                          "cos_solve_var": [0.006, 0.006], "anti_aligned_step": [1.0, float("nan")]})
    lv = run_levels(frame)
    assert lv["applied_micro"]["anti_aligned_frac"] == pytest.approx(0.375)
    assert lv["fresh_solve"]["cos_min_mean"] == pytest.approx(0.38)
    assert lv["step"]["anti_aligned_frac"] == 1.0 and math.isnan(lv["update"]["cos_var_mean"])
    v = levels_verdict({"marble_n5": [lv, lv], "zoo_x": [lv]}, {"marble_n5": "marble", "zoo_x": "gramian"})
    assert set(v["arms"]) == {"marble_n5"}  # only arms with a published row
    fresh = v["arms"]["marble_n5"]["fresh_solve"]["cos_min_mean"]
    assert fresh["paper"] == 0.37 and fresh["ours_minus_paper"]["mean"] == pytest.approx(0.01)
    assert v["arms"]["marble_n5"]["applied_micro"]["anti_aligned_frac"]["paper"] == 0.0
    assert v["paper_quantity"] == PAPER_QUANTITY and PAPER_QUANTITY["level"] == "fresh_solve"


def test_every_level_answer_against_the_paper_is_holm_adjusted_over_the_levels():
    """Issue 47 item 4: two seeds' anti-aligned fraction 0.05 and 0.07 at every level of a MARBLE
    arm (paper 0.0): each test alone p = 0.0628 (t = 0.06 / (0.01 sqrt 2 / sqrt 2), 1 df), never
    below 0.05; a 10-seed arm at 0.9-1.1 against the weighted sum's 0.8 stays decided after Holm
    over its 12 figures, the family named."""
    lv = {level: {"anti_aligned_frac": f, "cos_min_mean": 0.37, "cos_var_mean": 0.006}
          for level, f in zip(("fresh_solve", "applied_micro", "step", "update"), (0.0, 0.0, 0.0, 0.0))}
    runs = [{lvl: dict(v, anti_aligned_frac=x) for lvl, v in lv.items()} for x in (0.05, 0.07)]
    v = levels_verdict({"m": runs}, {"m": "marble"})
    step = v["arms"]["m"]["step"]["anti_aligned_frac"]
    assert step["p"] == pytest.approx(2 * stats.t.sf(6.0, 1)) and step["p_holm"] > step["p"]
    assert str(step["answer"]).startswith("no difference shown after Holm")
    assert step["family"] == SECTION_FAMILIES["levels"]
    wide = [{lvl: dict(v, anti_aligned_frac=0.9 + 0.02 * i) for lvl, v in lv.items()} for i in range(10)]
    w = levels_verdict({"ws": wide}, {"ws": "weighted_sum"})["arms"]["ws"]["update"]["anti_aligned_frac"]
    assert w["answer"] is True and w["p_holm"] < 0.05


def test_the_weighted_sums_fresh_solve_is_not_set_beside_the_paper():
    """The paper's weighted-sum row (80%, min cos -0.13) is of the weighted sum's own direction;
    a fresh min-norm solve on its batches is not a direction it takes. Before, the verdict and
    claim.md set that row beside 80% as if it were (issue 36 item 2: two quantities compared)."""
    from marble.experiments.claim_levels import NOT_ITS_DIRECTION
    from marble.experiments.claim_markdown import levels_frame

    lv = {level: {"anti_aligned_frac": 0.0, "cos_min_mean": 0.4, "cos_var_mean": 0.006}
          for level in ("fresh_solve", "applied_micro", "step", "update")}
    v = levels_verdict({"ws": [lv, lv], "m": [lv, lv]}, {"ws": "weighted_sum", "m": "marble"})
    fresh = v["arms"]["ws"]["fresh_solve"]["anti_aligned_frac"]
    assert fresh["paper"] is None and fresh["answer"] == NOT_ITS_DIRECTION
    assert fresh["ours"]["mean"] == 0.0 and "ours_minus_paper" not in fresh
    assert v["arms"]["ws"]["applied_micro"]["anti_aligned_frac"]["paper"] == 0.8
    assert v["arms"]["m"]["fresh_solve"]["anti_aligned_frac"]["paper"] == 0.0
    assert v["paper_quantity"]["by_method"] == {"marble": "fresh_solve", "weighted_sum": "applied_micro"}
    frame = levels_frame({"levels": v})
    assert frame.loc["ws / fresh_solve", "anti-aligned"].endswith("(not its direction)")
    assert frame.loc["ws / step", "anti-aligned"].endswith("(paper 0.8)")


def test_verdict_has_levels_from_the_runs_metrics():
    frame = pd.DataFrame({"step": [1, 2], "anti_aligned": [0.5, 0.0], "full_solve": [0, 0],
                          "cos_min": [-0.2, 0.1], "anti_aligned_step": [0.0, 1.0]})
    evals = pd.DataFrame([{"step": 0, "eval_reward/g": 0.0}, {"step": 2, "eval_reward/g": 1.0}])
    ms = [measure_run(a, s, frame, ["g"], evals) for a in ("weighted_sum", "marble") for s in (1, 2)]
    v = claim_verdict(ms, ["g"], {}, "marble", "weighted_sum")
    # per line a fraction of micro-steps: (0.5 + 0) / 2
    assert ms[0].anti["applied"] == pytest.approx(0.25)
    step = v["levels"]["arms"]["weighted_sum"]["step"]["anti_aligned_frac"]
    assert step["ours"]["mean"] == pytest.approx(0.5) and step["paper"] == 0.8


def test_claim_md_shows_the_levels_and_the_design_lines():
    from marble.experiments.claim_markdown import design_lines, levels_frame

    lv = {"fresh_solve": {"anti_aligned_frac": 0.0, "cos_min_mean": 0.4, "cos_var_mean": 0.006}}
    lv = {level: lv["fresh_solve"] for level in ("fresh_solve", "applied_micro", "step", "update")}
    v = {"levels": levels_verdict({"marble": [lv, lv]}, {"marble": "marble"}),
         "replication": {"status": "not replicated", "seed_sets": [[1, 2], [3, 4]],
                         "questions": {"q": {"status": "not replicated", "answers": [True, False]}}},
         "pilot": NO_PILOT}
    frame = levels_frame(v)
    assert list(frame.index) == [f"marble / {lv}" for lv in ("fresh_solve", "applied_micro", "step", "update")]
    assert frame.loc["marble / step", "min cos"] == "+0.4 [+0.4, +0.4] (paper 0.37)"
    lines = design_lines(v)
    assert lines[0] == "- Replication on seed sets [1, 2] and [3, 4]: not replicated."
    assert lines[1] == "  - q: not replicated (True / False)." and lines[-1] == "- Pilot: no pilot."


def test_the_theorem_reads_fresh_micro_steps_not_a_lines_mixed_mean(tmp_path):
    """With every micro-step measured, a solve step's line averages its solve with amortized
    micro-steps (cos_min -0.3 here); the theorem and the step-kind split read the records."""
    from marble.report.loading import read_metrics

    lines = [{"step": 1, "anti_aligned": 0.5, "full_solve": 0.5, "cos_min": -0.3,
              "diag_micro": [{"micro": 0, "source": "fresh", "cos_min": 0.2},
                             {"micro": 1, "source": "same_step", "cos_min": -0.8}]},
             {"step": 2, "anti_aligned": 0.0, "full_solve": 0.0, "cos_min": 0.1,
              "diag_micro": [{"micro": 0, "source": "earlier_step", "cos_min": 0.1},
                             {"micro": 1, "source": "earlier_step", "cos_min": None}]}]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    m = measure_run("marble", 1, read_metrics(path), ["g"], None)
    assert m.full_solve_min_cos == 0.2 and m.full_solve_steps == 1
    assert m.anti["full_solve"] == 0.0 and m.anti["amortized"] == 0.5  # -0.8 of 2 finite
    assert m.anti["applied"] == pytest.approx(0.25)


def test_a_pilot_from_runs_holds_each_questions_per_seed_values_and_effects(tmp_path):
    """marble.experiments.claim_pilot by hand: (b) the arm minus the baseline per seed, (c) the
    baseline's anti-aligned fraction minus the arm's, effects from the alone arms and the
    paper's gap; the written file is one pilot_section reads."""
    from marble.experiments.claim_pilot import pilot_from_measures
    from marble.runtime.io import write_json

    def run(arm, seed, g, s, anti):
        m = _measure(arm, seed, g, s)
        m.anti["applied"] = anti
        return m

    ms = [run("weighted_sum", 1, 0.1, 0.01, 0.6), run("weighted_sum", 2, 0.2, 0.02, 0.5),
          run("out", 1, 0.1, 0.04, 0.1), run("out", 2, 0.3, 0.03, 0.2),
          RunMeasure("alone_s", 1, {"s": 0.2}, {}, {}, math.nan, 0, 0),
          RunMeasure("alone_s", 2, {"s": 0.4}, {}, {}, math.nan, 0, 0)]
    pilot = pilot_from_measures(ms, ["g", "s"], {"s": 0.3}, "weighted_sum", 0.5, "abc1234")
    b = pilot["questions"]["b_specialists_rise_more_under_out"]["s"]
    assert b["per_seed"] == pytest.approx([0.03, 0.01]) and b["effect_of_interest"] == pytest.approx(0.15)
    c = pilot["questions"]["c_out_less_anti_aligned"]["anti_aligned"]
    assert c["per_seed"] == pytest.approx([0.5, 0.3]) and c["effect_of_interest"] == pytest.approx(0.4)
    a = pilot["questions"]["a_every_reward_rises_under_out"]
    assert a["g"]["per_seed"] == pytest.approx([0.1, 0.3]) and math.isnan(a["g"]["effect_of_interest"])
    assert pilot["seeds"] == [1, 2] and "weighted_sum" not in "".join(pilot["questions"])
    write_json(tmp_path / "claim_pilot.json", pilot)
    sec = pilot_section(load_pilot(tmp_path / "claim_pilot.json"), 10)
    assert sec["commit"] == "abc1234"
    assert sec["questions"]["c_out_less_anti_aligned"]["anti_aligned"]["pilot_seeds"] == 2


def test_the_n_curve_holds_only_arms_that_differ_in_n():
    """The default claim's figure stacked marble_n5, marble_output and marble_n5_normcorr as
    three unlabelled points at N = 5; the curve keeps the arms that differ from MARBLE's in N."""
    from marble.experiments.claim_figures import n_curve_arms

    base = {"method": "marble", "alpha_ema": 0.7, "weighting": None, "micro_batch": 6,
            "gram_space": "parameters", "cached_weights": "reference"}
    settings = {"marble_n5": {**base, "amortize_every": 5}, "marble_n1": {**base, "amortize_every": 1},
                "marble_output": {**base, "amortize_every": 5, "gram_space": "output"},
                "marble_n5_normcorr": {**base, "amortize_every": 5, "cached_weights": "norm_corrected"},
                "marble_n5_mb24": {**base, "amortize_every": 5, "micro_batch": 24},
                "marble_n5_ema0": {**base, "amortize_every": 5, "alpha_ema": 0.0},
                "weighted_sum": {**base, "method": "weighted_sum", "amortize_every": 5}}
    v = {"arms": list(settings), "arm_settings": settings, "marble_arm": "marble_n5"}
    assert n_curve_arms(v) == ["marble_n1", "marble_n5"]


def test_the_committed_pilot_fixes_the_main_runs_fresh_seeds_and_the_rules():
    """Issue 47 item 3: docs/claim_pilot.json names the main run's seeds (config.yaml's
    `claim.seeds`, none of the pilot's) and states the decision rules the verdict applies."""
    import yaml

    from marble.experiments.claim_rule import AMENDMENT, DECISION_RULES

    pilot = json.loads(open("docs/claim_pilot.json", encoding="utf-8").read())
    claim = yaml.safe_load(open("config.yaml", encoding="utf-8"))["claim"]
    assert pilot["main_run_seeds"] == claim["seeds"]
    used = set(pilot["seeds"]) | set(pilot["b_decidable"]["toy_warmth"]["learnable_alone"]["seeds"])
    assert not used & (set(claim["seeds"]) | set(claim["alone"]["seeds"]))
    assert pilot["decision_rules"] == DECISION_RULES
    # the sections' families, added to the pilot file before the main run (docs/claim.md)
    assert pilot["decision_rules_amendment"] == AMENDMENT
    assert "marble_exact" in claim["arms"]
    assert f"b_specialists_rise_more_under_{claim['marble_arm']}" in pilot["questions"]
    assert pilot["b_decidable"]["toy_warmth"]["decidable"] is True  # the toy where (b) can be decided


def test_a_pilot_files_nulls_read_back_as_nan_once(tmp_path):
    """Strict JSON writes an undefined figure as null: load_pilot reads every one back as NaN
    (a seed's unscorable value, an effect the pilot could not fix), so the power and the
    effects see the missing value, not None."""
    path = tmp_path / "pilot.json"
    path.write_text(json.dumps({"commit": "abc", "questions": {"b_specialists_rise_more_under_m": {
        "s": {"per_seed": [0.1, None, 0.3, 0.2], "effect_of_interest": None},
        "t": {"per_seed": [0.1, 0.2], "effect_of_interest": 0.05}}}}))
    pilot = load_pilot(path)
    spec = pilot["questions"]["b_specialists_rise_more_under_m"]["s"]
    assert math.isnan(spec["per_seed"][1]) and math.isnan(spec["effect_of_interest"])
    assert pilot_effects(pilot, "m") == {"t": 0.05}  # no effect fixed for s
    power = pilot_section(pilot, 10)["questions"]["b_specialists_rise_more_under_m"]
    assert power["s"]["pilot_seeds"] == 3 and power["s"]["powered"] is False
