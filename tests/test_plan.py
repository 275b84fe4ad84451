"""The paper tables' plan (which runs each table trains) and its cost before it runs."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
from test_workflow_lib import ROOT, snakemake

from marble.config import load_config
from marble.workflow import cost as wf_cost
from marble.workflow import plan as wf_plan
from marble.workflow.plan_cli import main as plan_main
from marble.workflow import configs

PAPER = configs.load(["config/paper.yaml"], ROOT)
RHO_RUNS = ["rho_07", "rho_01", "rho_03", "rho_05", "rho_09"]


def test_paper_tables_plan_every_row_once():
    by_table = wf_plan.table_runs(PAPER["runs"], "paper")
    assert by_table["rho_ablation"] == RHO_RUNS
    assert by_table["table1"] == ["rho_07", "weighted_sum", "sequential"]
    assert by_table["harmony"] == ["rho_07", "weighted_sum"]
    assert by_table["cost"] == []
    assert wf_plan.planned_runs(by_table) == RHO_RUNS[:1] + ["weighted_sum", "sequential"] + RHO_RUNS[1:]
    assert wf_plan.missing_rows(PAPER["runs"], "paper") == {}
    assert wf_plan.missing_rows({"a": {"preset": "rho_07"}}, "paper")["rho_ablation"] == \
        ["rho_01", "rho_03", "rho_05", "rho_09"]
    # the rho presets differ from rho_07 in alpha_ema alone
    base = dataclasses.asdict(load_config("rho_07"))
    for name, rho in zip(RHO_RUNS[1:], (0.1, 0.3, 0.5, 0.9)):
        cfg = dataclasses.asdict(load_config(name))
        assert cfg["balancer"]["alpha_ema"] == rho
        cfg["balancer"]["alpha_ema"] = 0.7
        assert {**cfg, "preset": "rho_07"} == base, name


def test_default_step_time_is_the_documented_flop_model():
    shape = wf_cost.run_shape(load_config("rho_07"))
    assert (shape.micro_steps, shape.rollout_forwards, shape.train_forwards, shape.tokens) == \
        (8 * 24, 72 * 25, 72 * 24 * 4, 1024)
    step = wf_cost.default_step_time(shape, gpus=16)
    flops = 2 * 2.243e9 * 1024 * (1800 + 6912)
    assert step.seconds == pytest.approx(flops / (989e12 * 0.40))
    assert "FLOP model" in step.source and "assumption" in step.source
    tiny = wf_cost.run_shape(load_config("tiny"))
    assert not tiny.paper_scale
    assert wf_cost.default_step_time(tiny, gpus=0).seconds == pytest.approx(
        0.14 * tiny.micro_steps * (1 + tiny.rollout_forwards / tiny.train_forwards))


SHAPE = wf_cost.RunShape(max_steps=100, balancer="weighted_sum", micro_steps=10,
                         rollout_forwards=10, train_forwards=40, tokens=1024, paper_scale=True)


def test_run_cost_sources_in_order_measured_bench_default():
    measured = wf_cost.run_cost("a", SHAPE, (2, 8), measured_step_s=36.0)
    assert measured.wall_h == pytest.approx(1.0) and measured.gpu_h == pytest.approx(16.0)
    bench = {"device": "cuda:0", "gpu": "H200", "preset": "bench_sd35m",
             "balancers": {"weighted_sum": {"step_s": 2.0}},
             "marble_run": {"retain": {"time": 1.5}}}
    timed = wf_cost.run_cost("a", SHAPE, (1, 8), bench)
    assert timed.step.seconds == pytest.approx(2.0 * 10 * 1.25)  # + rollout share 10/40
    assert timed.step.source.startswith("bench:")
    marble = wf_cost.run_cost("m", SHAPE.__class__(**{**SHAPE.__dict__, "balancer": "marble"}),
                              (1, 8), bench)
    assert marble.wall_h == pytest.approx(timed.wall_h * 1.5)  # the bench's MARBLE-run ratio
    cpu_bench = {**bench, "device": "cpu", "preset": "tiny"}  # another scale: not used
    assert wf_cost.run_cost("a", SHAPE, (1, 8), cpu_bench).step.source.startswith("default:")
    assert wf_cost.slowdown("marble", None) == pytest.approx(1 / 0.97)
    assert wf_cost.slowdown("mgda", None) == pytest.approx(1 / 0.56)


def test_plan_counts_a_run_in_two_tables_once():
    costs = {n: wf_cost.RunCost(n, 16, 10.0, wf_cost.StepTime(1.0, "x"))
             for n in ["rho_07", "weighted_sum", "rho_05", "equal_alpha"]}
    by_table = {"table1": ["rho_07", "weighted_sum"], "rho_ablation": ["rho_07", "rho_05"],
                "cost": [], wf_cost.OTHER: ["equal_alpha"]}
    plan = wf_cost.plan_cost(by_table, costs)
    assert plan["tables"]["rho_ablation"]["gpu_h"] == 320.0
    assert plan["total"]["runs"] == ["rho_07", "weighted_sum", "rho_05"]
    assert plan["total"]["gpu_h"] == 480.0 and plan["total"]["wall_h_serial"] == 30.0
    assert plan["all_configured"]["gpu_h"] == 640.0
    text = wf_cost.format_plan(plan, costs)
    assert "rho_ablation: 2 runs x 16 GPUs x 10.0 h = 320 GPU-h (rho_07, rho_05)" in text
    assert "paper tables, each run once: 3 runs, 480 GPU-h" in text


@pytest.mark.parametrize("argv,dry", [(["-n", "all"], True), (["-np", "x"], True),
                                      (["--dry-run"], True), (["-c2", "all"], False),
                                      (["--configfile", "c.yaml"], False)])
def test_is_dry_run(argv, dry):
    assert wf_plan.is_dry_run(argv) is dry


def test_marble_plan_prints_and_writes_json(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert plan_main(["--config", str(ROOT / "config/paper.yaml"), "--runs-dir",
                      str(tmp_path), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert re.search(r"rho_ablation: 5 runs x 16 GPUs x \d+\.\d h = \d+ GPU-h", printed)
    plan = json.loads(out.read_text())
    assert len(plan["total"]["runs"]) == 7 and plan["total"]["gpu_h"] > 0
    # The staged run: its stages' 1600 steps, 40-step rollouts (more GPU-hours than weighted_sum).
    assert re.search(r"table1: 3 runs x 16 GPUs .*\(rho_07, weighted_sum, sequential\)", printed)
    times = {names: float(sec) for sec, names in re.findall(r"step time (\d+) s .*\): (.+)", printed)}
    assert times["sequential"] > 1.5 * next(t for n, t in times.items() if "weighted_sum" in n)
    with pytest.raises(SystemExit, match="no such file"):
        plan_main(["--config", str(tmp_path / "none.yaml")])


def test_dry_run_of_paper_tables_plans_the_runs_and_prints_the_estimate():
    proc = snakemake(["-n", "paper_tables", "--configfile", "config/paper.yaml"], ROOT)
    trained = re.findall(r"rule train_run:\n(?:\s+\S.*\n)*?\s+wildcards: run=(\S+)", proc.stdout)
    assert sorted(trained) == sorted(RHO_RUNS + ["weighted_sum", "sequential"])  # once each, no equal_alpha
    for rule in ("rho_ablation", "harmony", "cost", "paper_tables", "bench_step"):
        assert re.search(rf"^{rule}\s+1$", proc.stdout, re.MULTILINE), rule
    assert re.search(r"rho_ablation: 5 runs x 16 GPUs x \d+\.\d h", proc.stderr)
    assert re.search(r"paper tables, each run once: 7 runs, \d+ GPU-h", proc.stderr)
