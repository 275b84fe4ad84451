"""Issue 36 items 3 and 5: the claim's micro-batch sweep, no-conflict control, dilution and
per-seed pretrained models (marble.experiments.claim_noise, marble.workflow.claim), by hand."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd
import pytest
from scipy import stats

from marble.experiments.claim_cli import pretrained_models
from marble.experiments.claim_levels import LEVELS
from marble.experiments.claim_rule import SECTION_FAMILIES
from marble.experiments.claim_noise import (
    control_section,
    dilution_section,
    falls_with_batch_size,
    noise_sentences,
    run_dilution,
    sweep_groups,
    sweep_section,
)
from marble.workflow.claim import control_arms, model_dir, runs, seed_model_pattern, sweep_arms, sweep_base

T975_2 = 4.302652729911275  # Student t, 0.975 quantile, 2 degrees of freedom


@dataclass
class Rec:  # the RunMeasure fields claim_noise reads
    arm: str
    seed: int
    levels: dict = field(default_factory=dict)
    dilution: dict = field(default_factory=dict)
    attenuation: dict = field(default_factory=dict)


def _levels(frac: float) -> dict:
    return {level: {"anti_aligned_frac": frac} for level in LEVELS}


def test_falls_with_batch_size_by_hand():
    """Size 6: 0.5, 0.6, 0.4; size 24: 0.2 each: paired differences 0.3, 0.4, 0.2 (mean 0.3,
    sd 0.1), interval 0.3 -+ t(0.975, 2) 0.1 / sqrt 3 = [0.052, 0.548]: it falls."""
    out = falls_with_batch_size({24: {1: 0.2, 2: 0.2, 3: 0.2}, 6: {1: 0.5, 2: 0.6, 3: 0.4},
                                 12: {1: 0.3, 2: 0.3, 3: 0.3}})
    half = T975_2 * 0.1 / math.sqrt(3)
    assert out["sizes"] == [6, 12, 24] and out["means"] == pytest.approx({6: 0.5, 12: 0.3, 24: 0.2})
    assert out["difference"]["mean"] == pytest.approx(0.3)
    assert out["difference"]["low"] == pytest.approx(0.3 - half)
    assert out["difference"]["high"] == pytest.approx(0.3 + half)
    assert out["answer"] is True
    # a fraction that rises with the micro-batch: false; one size: nothing to compare
    assert falls_with_batch_size({6: {1: 0.1, 2: 0.1, 3: 0.2}, 24: {1: 0.5, 2: 0.6, 3: 0.6}})["answer"] is False
    assert falls_with_batch_size({6: {1: 0.1, 2: 0.2}})["answer"] == "no difference larger than inf"


def test_sweep_groups_and_section_put_the_base_arm_at_its_own_micro_batch():
    arms = ["weighted_sum", "weighted_sum_mb12", "weighted_sum_mb24", "marble_n5", "orphan_mb12"]
    assert sweep_groups(arms, {"weighted_sum": 6, "marble_n5": 6}) == {
        "weighted_sum": {6: "weighted_sum", 12: "weighted_sum_mb12", 24: "weighted_sum_mb24"}}
    recs = [Rec(a, s, _levels(f)) for a, fs in (("weighted_sum", (0.5, 0.6, 0.4)),
                                                 ("weighted_sum_mb24", (0.2, 0.2, 0.2)))
            for s, f in zip((1, 2, 3), fs)]
    out = sweep_section(recs, {"weighted_sum": 6})
    assert out["weighted_sum"]["arms"] == {"6": "weighted_sum", "24": "weighted_sum_mb24"}
    # issue 47 item 4: one test per level, p 0.0355 each (true alone, as by hand above), Holm
    # over the family's 4 levels: 4 x 0.0355 = 0.142, undecided; the family is named
    p_one = 2 * stats.t.sf(0.3 / (0.1 / math.sqrt(3)), 2)
    for level in LEVELS:
        lv = out["weighted_sum"]["levels"][level]
        assert lv["by_size"]["6"]["mean"] == pytest.approx(0.5)
        falls = lv["falls_with_batch_size"]
        assert falls["p"] == pytest.approx(p_one) and falls["p_holm"] == pytest.approx(4 * p_one)
        assert falls["answer"].startswith("no difference shown after Holm adjustment")
        assert falls["family"] == SECTION_FAMILIES["noise.sweep"]
    # a falls that survives the family: differences 0.30, 0.31, 0.29 (p 0.0011, x 4 < 0.05)
    strong = [Rec("weighted_sum", s, _levels(f)) for s, f in zip((1, 2, 3), (0.5, 0.51, 0.49))]
    out = sweep_section(strong + recs[3:], {"weighted_sum": 6})
    assert all(lv["falls_with_batch_size"]["answer"] is True for lv in out["weighted_sum"]["levels"].values())


def test_control_section_by_hand():
    """Base arm 0.5, 0.55, 0.6; its control 0.1 each: beyond the control by 0.4, 0.45, 0.5 (mean
    0.45, sd 0.05, p 0.0041; Holm over the 4 levels 0.016): true. The control alone: mean 0.1.
    Base 0.5, 0.6, 0.7 (p 0.013 alone): Holm 0.052, undecided."""
    base = [Rec("weighted_sum", s, _levels(f)) for s, f in zip((1, 2, 3), (0.5, 0.55, 0.6))]
    ctrl = [Rec("control_weighted_sum", s, _levels(0.1)) for s in (1, 2, 3)]
    out = control_section(ctrl, base)["control_weighted_sum"]
    assert out["base_arm"] == "weighted_sum"
    p_one = 2 * stats.t.sf(0.45 / (0.05 / math.sqrt(3)), 2)
    for level in LEVELS:
        assert out["levels"][level]["mean"] == pytest.approx(0.1)
        beyond = out["conflict_beyond_control"][level]
        assert beyond["difference"]["mean"] == pytest.approx(0.45) and beyond["answer"] is True
        assert beyond["p_holm"] == pytest.approx(4 * p_one) and beyond["family"] == SECTION_FAMILIES["noise.control"]
    wider = [Rec("weighted_sum", s, _levels(f)) for s, f in zip((1, 2, 3), (0.5, 0.6, 0.7))]
    step = control_section(ctrl, wider)["control_weighted_sum"]["conflict_beyond_control"]["step"]
    assert step["difference"]["low"] > 0  # the interval alone would say true
    assert step["answer"].startswith("no difference shown after Holm adjustment")
    # the control as anti-aligned as the arm: no difference shown
    same = control_section([Rec("control_weighted_sum", s, _levels(f)) for s, f in zip((1, 2, 3), (0.5, 0.55, 0.6))],
                           base)["control_weighted_sum"]["conflict_beyond_control"]["step"]
    assert same["difference"]["mean"] == pytest.approx(0.0) and isinstance(same["answer"], str)


def test_run_dilution_and_the_section_by_hand():
    frame = pd.DataFrame({"dilution/s": [0.5, math.nan, 0.7], "dilution/g": [1.0, 1.0, 1.0]})
    d = run_dilution(frame, ["g", "s", "never"])
    assert d["g"] == 1.0 and d["s"] == pytest.approx(0.6) and math.isnan(d["never"])
    recs = [Rec("weighted_sum", 1, dilution={"s": 0.2, "g": 0.9}, attenuation={"s": 0.1, "g": 1.2}),
            Rec("weighted_sum", 2, dilution={"s": 0.4, "g": 0.9}, attenuation={"s": 0.3, "g": 1.4})]
    out = dilution_section(recs, ["g", "s"], {"s": 0.33}, ["weighted_sum"])
    assert out["rewards"]["s"]["specialist"] and not out["rewards"]["g"]["specialist"]
    assert out["rewards"]["s"]["weighted_sum_advantage"]["weighted_sum"]["mean"] == pytest.approx(0.3)
    assert out["rewards"]["s"]["own_advantage"] == 1.0
    # the slope beside the correlation, not cut to [-1, 1] (a slope can exceed 1)
    assert out["rewards"]["s"]["attenuation"]["weighted_sum"]["mean"] == pytest.approx(0.2)
    assert out["rewards"]["g"]["attenuation"]["weighted_sum"]["mean"] == pytest.approx(1.3)
    text = noise_sentences({"sweep": {}, "control": {}}, out)
    assert text == ["Dilution of s: the weighted sum's advantage correlates with its own at weighted_sum "
                    "0.300 (MARBLE's per-reward advantage: 1)."]


SECTION = {"seeds": [1, 2], "max_steps": 3, "set": [],
           "arms": {"weighted_sum": {"preset": "tiny_weighted_sum"},
                    "marble_n5": {"preset": "tiny", "set": ["balancer.amortize_every=5"]}},
           "sweep": {"arms": ["marble_n5"], "micro_batch": [12, 24]},
           "control": {"arms": ["weighted_sum"],
                       "rewards": [{"name": "toy_brightness"},
                                   {"name": "toy_brightness_copy", "applies_to": ["ocr"]}]}}


def test_sweep_and_control_arms_are_claim_runs():
    sweep = sweep_arms(SECTION)
    assert sweep == {
        "marble_n5_mb12": {"preset": "tiny", "max_steps": 3,
                           "set": ["train.eval_every=3", "balancer.amortize_every=5", "train.batch_size=12"]},
        "marble_n5_mb24": {"preset": "tiny", "max_steps": 3,
                           "set": ["train.eval_every=3", "balancer.amortize_every=5", "train.batch_size=24"]}}
    assert sweep_base("marble_n5_mb12") == ("marble_n5", 12) and sweep_base("marble_n5") is None
    control = control_arms(SECTION)["control_weighted_sum"]
    assert control["set"][-1] == ('rewards=[{"name": "toy_brightness"}, '
                                  '{"name": "toy_brightness_copy", "applies_to": ["ocr"]}]')
    names = set(runs(SECTION))
    assert names == {f"{a}-s{s}" for a in ("weighted_sum", "marble_n5", "marble_n5_mb12", "marble_n5_mb24",
                                          "control_weighted_sum") for s in (1, 2)}
    with pytest.raises(ValueError, match="claim.sweep.arms: 'nope' is not a claim arm"):
        sweep_arms({**SECTION, "sweep": {"arms": ["nope"], "micro_batch": [12]}})
    with pytest.raises(ValueError, match="claim.control.arms: 'nope'"):
        control_arms({**SECTION, "control": {"arms": ["nope"]}})


def test_the_control_and_sweep_overrides_load_as_a_config():
    from marble.config import grad_accumulation, load_config

    spec = control_arms(SECTION)["control_weighted_sum"]
    cfg = load_config(spec["preset"], overrides=spec["set"])
    assert [(r.name, r.applies_to) for r in cfg.rewards] == [("toy_brightness", None),
                                                            ("toy_brightness_copy", ["ocr"])]
    # the same 24 rollouts per step in 4, 2 and 1 micro-batches
    steps = [grad_accumulation(load_config("tiny", overrides=[f"train.batch_size={b}"])) for b in (6, 12, 24)]
    assert steps == [4, 2, 1]


def test_each_seed_starts_from_its_own_pretrained_model_when_asked():
    assert model_dir(SECTION, "weighted_sum-s2", "data/models/tiny-sd3") == "data/models/tiny-sd3"
    per_seed = {**SECTION, "pretrain_per_seed": True}
    assert model_dir(per_seed, "marble_n5_mb12-s2", "data/models/tiny-sd3/") == "data/models/claim/tiny-sd3-s2"
    assert seed_model_pattern("data/models/tiny-sd3") == "data/models/claim/tiny-sd3-s{seed}"
    shared = pretrained_models({"a-s1": "m", "b-s1": "m", "a-s2": "m"})
    assert shared == {"per_seed": False, "by_seed": {"1": ["m"], "2": ["m"]}}
    own = pretrained_models({"a-s1": "m-s1", "b-s1": "m-s1", "a-s2": "m-s2"})
    assert own["per_seed"] is True
    assert pretrained_models({"a-s1": "m-s1", "b-s1": "m-s9", "a-s2": "m-s2"})["per_seed"] is False



def test_a_control_without_rewards_is_an_error_naming_the_key():
    with pytest.raises(ValueError, match="claim.control.rewards: name the control's rewards"):
        control_arms({**SECTION, "control": {"arms": ["weighted_sum"]}})


def _write_run(root, arm: str, seed: int, anti: float, rewards: list[str], batch: int, dilution_s: float):
    """A claim run folder as `marble train` leaves it: config.yaml, metrics.jsonl (two
    diagnostic steps at every level), eval.jsonl (step 0 and 2), train_summary.json."""
    import json

    import yaml

    run = root / f"{arm}-s{seed}"
    run.mkdir(parents=True)
    method = "marble" if arm.startswith("marble") else "weighted_sum"
    cfg = {"balancer": {"method": method, "amortize_every": 5 if method == "marble" else None,
                        "alpha_ema": 0.7 if method == "marble" else None},
           "train": {"batch_size": batch, "max_steps": 2, "seed": seed},
           "model": {"path": f"data/models/claim/tiny-sd3-s{seed}"},
           "rewards": [{"name": r} for r in rewards]}
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    lines = []
    for step in (1, 2):
        line = {"step": step, "full_solve": 1.0 if method == "marble" and step == 1 else 0.0,
                "cos_min": 0.3 if method == "marble" else -0.1}
        for level_cols in LEVELS.values():
            line[level_cols[0]] = anti
        for r in rewards:
            line[f"reward/{r}"] = 0.5
            line[f"reward_applicable/{r}"] = 3 if r == rewards[-1] else 12
            line[f"dilution/{r}"] = dilution_s if r == rewards[-1] else 0.9
        lines.append(line)
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    evals = [{"step": 0, **{f"eval_reward/{r}": 0.0 for r in rewards}},
             {"step": 2, **{f"eval_reward/{r}": 0.1 * seed for r in rewards}}]
    (run / "eval.jsonl").write_text("".join(json.dumps(x) + "\n" for x in evals))
    (run / "train_summary.json").write_text(json.dumps({"cpu_time_s": 10.0}))


def test_the_claim_cli_reports_sweep_control_dilution_and_models(tmp_path):
    """Synthetic runs: the weighted sum anti-aligned 0.5 / 0.6 / 0.4 at micro-batch 6 and 0.2 at
    12 (falls), its control (copies of one reward) 0.1, MARBLE's rollouts 0.0; the weighted
    sum's advantage correlates 0.2 / 0.3 / 0.4 with the specialist's own."""
    import json

    from marble.experiments.claim_cli import main

    runs = tmp_path / "runs"
    for seed, ws in zip((1, 2, 3), (0.5, 0.6, 0.4)):
        _write_run(runs, "weighted_sum", seed, ws, ["g", "s"], 6, 0.1 + 0.1 * seed)
        _write_run(runs, "weighted_sum_mb12", seed, 0.2, ["g", "s"], 12, 0.5)
        _write_run(runs, "marble_n5", seed, 0.0, ["g", "s"], 6, 0.6)
        _write_run(runs, "control_weighted_sum", seed, 0.1, ["b", "b_copy"], 6, 1.0)
    out = tmp_path / "out"
    assert main(["--runs", str(runs), "--marble-arm", "marble_n5", "--baseline-arm", "weighted_sum",
                 "--pilot", str(tmp_path / "none.json"), "--out", str(out)]) == 0
    v = json.loads((out / "verdict.json").read_text())
    assert "control_weighted_sum" not in v["arms"] and v["rewards"] == ["g", "s"]
    sweep = v["noise"]["sweep"]["weighted_sum"]
    assert sweep["arms"] == {"6": "weighted_sum", "12": "weighted_sum_mb12"}
    falls = sweep["levels"]["step"]["falls_with_batch_size"]
    assert falls["means"] == {"6": pytest.approx(0.5), "12": pytest.approx(0.2)}
    assert falls["answer"].startswith("no difference shown after Holm")  # p 0.035 x 4 levels
    control = v["noise"]["control"]["control_weighted_sum"]
    assert control["levels"]["update"]["mean"] == pytest.approx(0.1)
    assert control["conflict_beyond_control"]["applied_micro"]["difference"]["mean"] == pytest.approx(0.4)
    dil = v["dilution"]["rewards"]["s"]
    assert dil["specialist"] and dil["weighted_sum_advantage"]["weighted_sum"]["mean"] == pytest.approx(0.3)
    assert dil["weighted_sum_advantage"]["marble_n5"]["mean"] == pytest.approx(0.6)
    assert v["replication"]["pretrained_models"]["per_seed"] is True
    assert any(s.startswith("No-conflict control control_weighted_sum") for s in v["sentences"])
    assert any(s.startswith("Dilution of s:") for s in v["sentences"])


def test_noise_sentences_say_true_false_or_a_bound():
    sweep = {"w": {"levels": {"step": {"falls_with_batch_size": {"means": {6: 0.5, 24: None}, "answer": True}}}}}
    control = {"control_w": {"base_arm": "w", "levels": {"step": {"mean": 0.1}},
                             "conflict_beyond_control": {"step": {"answer": "no difference larger than 0.2"}}}}
    assert noise_sentences({"sweep": sweep, "control": control}, {}) == [
        "w, anti-aligned fraction by micro-batch size: step (6: 0.500, 24: n/a) falls: true.",
        "No-conflict control control_w, anti-aligned fraction: step 0.100 (beyond the control in w: "
        "no difference larger than 0.2)."]


def test_config_yaml_claim_control_has_as_many_rewards_as_the_claim_and_every_arm_is_priced():
    """Issue 47 item 6: config.yaml's control has K copies of brightness, K = the claim's own
    reward count (the minimum of more noisy cosines is negative more often), and the cost rule
    prices every reported arm, the sweep's and the control's too (the sweep printed "xn/a")."""
    import yaml

    from marble.config import load_config
    from marble.workflow.claim import arms, priced_arms

    for path in (".test/config.yaml", "config.yaml"):  # CI's shrunk claim too
        shrunk = yaml.safe_load(open(path, encoding="utf-8"))["claim"]
        real = load_config("tiny", overrides=list(shrunk.get("set", []))).rewards
        spec = control_arms(shrunk)[f"control_{shrunk['control']['arms'][0]}"]
        control = load_config(spec["preset"], overrides=spec["set"]).rewards
        assert len(control) == len(real) == 4, path
    claim = yaml.safe_load(open("config.yaml", encoding="utf-8"))["claim"]
    section = {**claim, "arms": {**claim["arms"]}}
    real = load_config("tiny", overrides=list(claim["set"])).rewards
    assert {r.name for r in control} == {"toy_brightness", "toy_brightness_copy", "toy_brightness_copy2",
                                         "toy_brightness_copy3"}
    # the claim's own set: toy_warmth replaces text contrast (the demo's preset keeps it)
    assert [r.name for r in real] == ["toy_brightness", "toy_saturation", "toy_warmth", "toy_color_match"]
    priced = priced_arms(section)
    assert set(priced) == set(arms(section)) | set(sweep_arms(section)) | set(control_arms(section))
    assert "priced_arms(CLAIM)" in open("workflow/rules/claim.smk", encoding="utf-8").read()


def test_an_overlay_drops_an_alone_source_with_null():
    from marble.workflow.claim import alone_arms

    section = {**SECTION, "alone": {"rewards": ["s"], "sources": {"s": ["ocr"], "other": None}}}
    assert list(alone_arms(section)) == ["alone_s"]
    with pytest.raises(ValueError, match="not among claim.alone.rewards"):
        alone_arms({**SECTION, "alone": {"rewards": ["s"], "sources": {"other": ["ocr"]}}})
