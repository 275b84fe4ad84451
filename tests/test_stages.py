"""Stages of a run: config validation, the step -> stage arithmetic, a mixed sampling batch.

Pure and torch-free; the trainer's switch and its resume are tests/test_resume.py's
test_staged_resume_across_every_boundary_is_bitwise.
"""

from __future__ import annotations

import pytest

from marble.config import ConfigError, dump_yaml, load_config, stage_config
from marble.config_stages import source_counts, stage_index, stage_starts
from marble.data.sampler import StratifiedKRepeatSampler


def test_tiny_sequential_has_one_stage_per_toy_prompt_kind():
    cfg = load_config("tiny_sequential")
    assert [(s.name, s.sources, s.steps) for s in cfg.stages] == [
        ("pickscore", ["pickscore"], 10), ("geneval", ["geneval"], 10), ("ocr", ["ocr"], 10)]
    ocr = stage_config(cfg, 2)
    assert ocr.reward_names == ["toy_text_contrast"] and ocr.balancer.method == "weighted_sum"
    assert not ocr.stages and cfg.train.max_steps == 30


def test_paper_sequential_presets_follow_appendix_c():
    cfg = load_config("sequential")
    assert [s.steps for s in cfg.stages] == [800, 300, 200, 200, 100]
    assert cfg.train.max_steps == 1600 and cfg.sampling.num_steps == 40
    assert stage_config(cfg, 0).reward_names == ["pickscore", "hpsv2", "clipscore"]
    assert [stage_config(cfg, i).reward_names for i in (1, 3, 4)] == [["geneval"]] * 2 + [["ocr"]]
    assert [s.steps for s in load_config("sequential_1700").stages][-1] == 200
    # DiffusionNFT's return_decay caps type 1 at 0.5; 0.95 is MARBLE's (issue 36 item 7)
    assert cfg.train.old_decay_type == 1 and cfg.train.old_decay_cap == 0.5
    assert load_config("tiny_sequential").train.old_decay_cap == 0.5
    assert load_config("weighted_sum").train.old_decay_cap == 0.95  # MARBLE's baseline keeps it


def test_stage_overrides_balancer_keys_and_lr_over_the_runs():
    cfg = load_config("tiny_sequential", overrides=[
        "stages=[{name: a, steps: 30, balancer: {method: marble, alpha_ema: 0.5}, lr: 0.001}]"])
    one = stage_config(cfg, 0)
    assert (one.balancer.method, one.balancer.alpha_ema, one.balancer.amortize_every) == ("marble", 0.5, 5)
    assert one.train.lr == 0.001 and one.reward_names == cfg.reward_names  # None: all rewards


@pytest.mark.parametrize("stage, message", [
    ("{name: a, steps: 30, prompts: [ocr]}", "unknown config key `stages[0].prompts`"),
    ("{name: a, steps: 30, balancer: {methd: mgda}}", "stages[0] (a): unknown config key `balancer.methd`"),
    ("{name: a, steps: 30, balancer: {alpha_ema: 1.5}}", "stages[0] (a): `balancer.alpha_ema`"),
    ("{name: a, steps: 30, rewards: [pickscore]}", "`stages[0].rewards` names ['pickscore']"),
    ("{name: a, steps: 30, lr: -1.0}", "`stages[0].lr` = -1.0 must be > 0"),
    ("{name: a, steps: 0}", "`stages[0].steps` = 0 must be > 0"),
    ("{name: a, steps: 30, sources: [ocr], mix: [.nan]}", "`stages[0].mix[0]` = nan must be a finite"),
    ("{name: a, steps: 30, sources: [ocr], mix: [1.0, 2.0]}", "`stages[0].mix` needs one share"),
    ("{name: a, steps: 20}", "`train.max_steps` = 30 is past the stages' end (20 = 20 steps)"),
])
def test_a_bad_stage_is_one_error_naming_the_stage_and_key(stage, message):
    with pytest.raises(ConfigError) as exc:
        load_config("tiny_sequential", overrides=[f"stages=[{stage}]"])
    assert message in str(exc.value)


def test_a_run_without_stages_writes_its_config_yaml_unchanged():
    assert "stages" not in dump_yaml(load_config("tiny"))
    assert "stages:" in dump_yaml(load_config("tiny_sequential"))


def test_stage_index_by_hand():
    lengths = [2, 3, 1]
    assert stage_starts(lengths) == [0, 2, 5]
    assert [stage_index(s, lengths) for s in range(7)] == [0, 0, 1, 1, 1, 2, 2]
    assert stage_index(123, []) == 0  # no stages: the run is stage 0


def test_source_counts_largest_remainder_by_hand():
    assert source_counts(6, [1, 1, 1]) == [2, 2, 2]
    assert source_counts(5, [2.0, 1.0]) == [3, 2]  # 3.33 + 1.67: the 0.67 remainder wins
    assert source_counts(4, [1, 1, 1]) == [2, 1, 1]  # a tie goes to the first source
    assert source_counts(10, [0.7, 0.2, 0.1]) == [7, 2, 1]


def test_sampler_mix_sets_prompts_per_source():
    sources = ["a"] * 10 + ["b"] * 10
    mixed = StratifiedKRepeatSampler(sources, k=2, batch_size=8, world_size=1, rank=0, seed=0,
                                     source_shares={"a": 3.0, "b": 1.0})
    assert mixed.counts == [3, 1]
    plan = mixed.global_plan(0).ravel()
    assert sum(int(i) < 10 for i in plan) == 6  # 3 prompts of `a`, each k = 2 times
    even = StratifiedKRepeatSampler(sources, k=2, batch_size=8, world_size=1, rank=0, seed=0)
    assert even.counts == [2, 2]
    with pytest.raises(ValueError, match="shares for"):
        StratifiedKRepeatSampler(sources, k=2, batch_size=8, world_size=1, rank=0, seed=0,
                                 source_shares={"a": 1.0})


def test_report_marks_stage_boundaries_and_keeps_a_staged_run_apart(tmp_path):
    import json

    from marble.report.figures import stage_boundaries, training_curves
    from marble.report.loading import RunData, read_metrics

    lines = [{"step": s, "stage": st, "stage_name": n, "reward/a": 0.1 * s, "balancer": "weighted_sum"}
             for s, st, n in [(1, 0, "p"), (2, 0, "p"), (3, 1, "g"), (4, 2, "o"), (5, 2, "o")]]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    metrics = read_metrics(path)
    assert stage_boundaries(metrics) == [(2.5, "g"), (3.5, "o")]
    assert stage_boundaries(metrics.drop(columns=["stage", "stage_name"])) == []
    staged = RunData("seq", tmp_path, {"balancer": {"method": "weighted_sum"},
                                       "stages": [{"name": "p"}]}, metrics)
    assert staged.balancer == "sequential"  # not pooled with the joint weighted-sum runs
    assert training_curves([staged], tmp_path / "curves.png").is_file()


def test_a_stage_draws_only_its_sources_rows_and_a_missing_source_is_named():
    import pandas as pd

    from marble.training.run_dir import TrainError
    from marble.training.stages import StageSchedule

    cfg = load_config("tiny_sequential", overrides=[
        ("stages=[{name: a, steps: 10, sources: [ocr, geneval], mix: [3.0, 1.0]},"
         " {name: b, steps: 20}, {name: c, steps: 1, sources: [drawbench]}]")])
    table = pd.DataFrame({"source": ["ocr", "pickscore", "geneval", "ocr"], "prompt": list("wxyz")})
    schedule = StageSchedule(cfg)
    assert schedule.table(table, 0)["prompt"].tolist() == ["w", "y", "z"]
    assert schedule.table(table, 1) is table and schedule.shares(1) is None  # no sources: all
    assert schedule.shares(0) == {"ocr": 3.0, "geneval": 1.0}
    assert [schedule.index(s) for s in (0, 9, 10, 29, 30)] == [0, 0, 1, 1, 2]
    with pytest.raises(TrainError, match=r"stage 'c': `sources` \['drawbench'\] have no rows"):
        schedule.table(table, 2)


def test_a_staged_run_does_not_make_a_generalist_a_specialist():
    """Specialists are read from the rollouts a reward applies to; a staged run logs `b` in one
    stage of two only (half the steps), which is a stage length, not applicability."""
    import pandas as pd

    from marble.report.build import all_specialists
    from marble.report.loading import RunData

    joint = pd.DataFrame({"step": [1, 2], "reward_applicable/a": [6, 6], "reward_applicable/b": [6, 6],
                          "reward_applicable/c": [2, 2]})
    staged = pd.DataFrame({"step": [1, 2], "reward_applicable/a": [6, 6],
                           "reward_applicable/b": [6, None], "reward_applicable/c": [None, 6]})
    config = {"rewards": [{"name": n} for n in "abc"]}
    runs = [RunData("ws", None, config, joint),
            RunData("seq", None, {**config, "stages": [{"name": "p"}, {"name": "q"}]}, staged)]
    assert all_specialists(runs) == {"c": 2 / 6}
