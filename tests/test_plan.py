"""The paper tables' plan (which runs each table trains) and its cost before it runs."""

from __future__ import annotations

import copy
import dataclasses
import json
import re

import pytest
from extras import needs
from test_workflow_lib import ROOT, copy_workflow, snakemake

from marble.balancers.weightings import WEIGHTINGS
from marble.config import load_config
from marble.workflow import configs
from marble.workflow import cost as wf_cost
from marble.workflow import flops as wf_flops
from marble.workflow import plan as wf_plan
from marble.workflow import plan_format, plan_log, plan_price
from marble.workflow.plan_cli import main as plan_main

PAPER = configs.load(["config/paper.yaml"], ROOT)
TABLE = wf_flops.load_table()
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


def _rho(**kw):
    """rho_07 as config/paper.yaml trains it, priced alone (no run folder: from step 0)."""
    return plan_price.price([("train_run", {"run": "rho_07"})], PAPER, kw.pop("root"), **kw)


def test_gpu_hours_per_training_step_are_the_counted_flops_at_the_stated_utilisation(tmp_path):
    """Per optimizer step and GPU: 72 rollout images (sampled, decoded, scored) and 192
    micro-steps at the cadence's rows, all from the counted table; GPU-hours = those FLOPs x 16
    GPUs / (989 TFLOP/s x 40%). Was 2 x 2.243e9 params x 1024 tokens per forward (about twice)."""
    from marble.balancers.cadence import run_overhead

    result = _rho(root=tmp_path)
    job, = result["jobs"]
    cfg = plan_price.run_config(PAPER["runs"]["rho_07"], PAPER)
    micro = TABLE["micro_step"][wf_flops.micro_key(cfg)]["rows"]
    per_step = (72 * TABLE["rollout"][wf_flops.rollout_key(cfg)]["flops"]
                + 72 * TABLE["vae_decode"]["sd3/512px"]["flops"]
                + 72 * sum(wf_flops.scorer_flops(n) for n in cfg.reward_names)
                + run_overhead(cfg, micro)["flops"] / 1000)
    assert 192 * micro["weighted_sum"] < run_overhead(cfg, micro)["flops"] / 1000 < 1.01 * 192 * micro["weighted_sum"]
    expected = per_step * 16 / (989e12 * 0.40) / 3600
    # The reference's held-out evaluation (train.eval_every 10: steps 0, 10, ..., 1000) on the
    # mixed test split (5278 rows, 1 image each, dealt over 16 ranks: 330 a rank), 40 eval steps
    # at the rollout's per-step cost, decoded and scored: priced apart from the steps.
    per_image = (TABLE["rollout"][wf_flops.rollout_key(cfg)]["flops"] * 40 / 25
                 + TABLE["vae_decode"]["sd3/512px"]["flops"]
                 + sum(wf_flops.scorer_flops(n) for n in cfg.reward_names))
    heldout = 101 * 330 * per_image
    assert job.flops["held-out evaluation"] == pytest.approx(16 * heldout)
    heldout_h = heldout * 16 / (989e12 * 0.40) / 3600
    assert (job.gpu_h - heldout_h) / 1000 == pytest.approx(expected, rel=0.01)  # + checkpoint writes (<0.1%)
    assert job.gpus == 16 and job.detail["steps"] == 1000
    old = 2 * 2.243e9 * 1024 * (72 * 25 + 72 * 24 * 4) * 16 / (989e12 * 0.40) / 3600
    assert 0.4 < expected / old < 0.65  # the former model's twofold overcount
    text = plan_format.format_plan(result)
    assert "40% utilisation (MFU) of H200's 989 TFLOP/s peak" in text and "an assumption" in text
    assert re.search(r"rho_07 \(marble\): 1000 steps x 16 GPUs x \d+\.\d h = \d+ GPU-h", text)


def test_a_gpu_bench_replaces_the_assumed_utilisation(tmp_path):
    key = wf_flops.micro_key(load_config("bench_sd35m"))
    ws = TABLE["micro_step"][key]["rows"]["weighted_sum"]
    bench = {"device": "cuda:0", "gpu": "NVIDIA H200", "preset": "bench_sd35m", "mixed_precision": "bf16",
             "balancers": {"weighted_sum": {"step_s": ws / 300e12}}}  # 300 TFLOP/s measured
    job, = _rho(root=tmp_path, bench=bench)["jobs"]
    assert job.throughput.flops_per_s == pytest.approx(300e12)
    assert job.throughput.source.startswith("measured") and "30% of H200" in job.throughput.source
    assumed, = _rho(root=tmp_path)["jobs"]
    assert job.gpu_h == pytest.approx(assumed.gpu_h * 0.40 * 989 / 300, rel=1e-3)
    cpu_bench = {**bench, "device": "cpu"}  # another kind of device: not this job's figure
    assert _rho(root=tmp_path, bench=cpu_bench)["jobs"][0].throughput.source.startswith("assumed")


def test_a_cpu_bench_measures_the_cpu_and_an_unusable_one_is_named():
    """The tiny workflow's own bench (mixed_precision "no", which YAML would read as false)."""
    ws = TABLE["micro_step"][wf_flops.micro_key(load_config("tiny"))]["rows"]["weighted_sum"]
    bench = {"device": "cpu", "gpu": None, "preset": "tiny", "mixed_precision": "no",
             "balancers": {"weighted_sum": {"step_s": 0.5}}}
    measured = wf_cost.cpu_throughput(bench, TABLE)
    assert measured.flops_per_s == pytest.approx(ws / 0.5) and measured.source.startswith("measured")
    unknown = wf_cost.cpu_throughput({**bench, "preset": "no_such_preset"}, TABLE)
    assert unknown.flops_per_s == pytest.approx(ws / wf_cost.TINY_MICRO_STEP_S)
    assert "not used" in unknown.source and "no_such_preset" in unknown.source


def test_a_resumed_run_costs_its_remaining_steps(tmp_path):
    full, = _rho(root=tmp_path)["jobs"]
    ckpt = tmp_path / "results/runs/rho_07/checkpoints/checkpoint-000500"
    ckpt.mkdir(parents=True)
    (ckpt / "COMPLETE").write_text("{}")
    half, = _rho(root=tmp_path)["jobs"]
    assert half.detail == {**half.detail, "from_step": 500, "steps": 500}
    # the warm-up step's 192 full solves are behind it: a little under half
    assert 0.49 * full.total_flops < half.total_flops < 0.5 * full.total_flops


ZOO = ["zoo_" + w for w in WEIGHTINGS]


def test_each_balancer_is_priced_from_its_own_counted_rows(tmp_path):
    """Every balancer the project has: amortized micro-steps at the weighted sum's row, full
    solves at the balancer's own row, so a zoo weighting's price moves with its own row only."""
    needs("torchjd", "zoo")
    runs = {p: {"preset": p} for p in ["weighted_sum", "equal_alpha", "full_mgda", "rho_07",
                                       "gdpo", "reward_sum", *ZOO]}
    config = {**PAPER, "runs": runs}
    jobs = [("train_run", {"run": r}) for r in runs]

    def micro(table):
        out = plan_price.price(jobs, config, tmp_path, table=table)
        assert not out["unpriced"], out["unpriced"]
        return {j.name: j.flops["micro-steps"] for j in out["jobs"]}

    base = micro(TABLE)
    ws = base["weighted_sum"]
    assert base["gdpo"] == base["reward_sum"] == ws  # advantage-level: the weighted sum's step
    assert base["full_mgda"] > 2 * ws  # a full solve on every micro-step
    for name in ["rho_07", *ZOO]:
        assert ws < base[name] < 1.01 * ws, name  # amortized: solves every 10th step only
    bumped = copy.deepcopy(TABLE)
    key = wf_flops.micro_key(load_config("zoo_upgrad"))
    bumped["micro_step"][key]["rows"]["zoo_upgrad_full"] *= 2
    changed = {n for n, v in micro(bumped).items() if v != base[n]}
    assert changed == {"zoo_upgrad"}


def test_an_evaluation_job_is_generation_decode_text_scoring_and_the_judge(tmp_path):
    ev = PAPER["eval"]
    job = plan_price.eval_job({"settings": "s", "run": "sd35l", "ckpt": "base", "dataset": "drawbench"},
                              plan_price.context(PAPER, tmp_path, None))
    n = job.detail["samples"]
    assert n == 1000 and "reference" in job.detail["samples_from"]  # nothing downloaded in tmp_path
    forward = TABLE["forward"]["sd35l/1024px/t333"]["flops"]
    assert job.flops["generation"] == n * 28 * 2 * forward  # 28 steps, CFG 3.5: two passes
    assert job.flops["VAE decode"] == n * TABLE["vae_decode"]["sd3/1024px"]["flops"]
    assert job.flops["judge"] == n * wf_flops.JUDGE_FLOPS  # drawbench scores unifiedreward
    assert job.gpus == ev["resources"]["gpus"] and job.gpu_h > 0
    flux = plan_price.eval_job({"settings": "s", "run": "flux_dev", "ckpt": "base", "dataset": "ocr"},
                               plan_price.context(PAPER, tmp_path, None))
    assert "judge" not in flux.flops  # FLUX.1-dev: guidance distilled, one pass a step
    assert flux.flops["generation"] == 1018 * 50 * TABLE["forward"]["flux_dev/1024px/t512"]["flops"]


def test_a_shape_the_table_has_not_counted_is_named_not_priced_as_zero(tmp_path):
    config = {**PAPER, "runs": {"big": {"preset": "rho_07", "set": ["train.batch_size=3"]}}}
    out = plan_price.price([("train_run", {"run": "big"})], config, tmp_path)
    assert out["jobs"] == [] and out["unpriced"][0][:2] == ("train_run", "big")
    assert "not counted" in out["unpriced"][0][2] and "--write" in out["unpriced"][0][2]
    assert re.search(r"not priced: 1 job\(s\), .*not counted.*: train_run big$", plan_format.format_plan(out),
                     re.MULTILINE)


def test_the_dry_run_handler_prices_the_jobs_snakemake_lists(capsys):
    import logging

    from snakemake_interface_logger_plugins.common import LogEvent

    seen = []
    handler = plan_log.DryRunPlan(seen.append)
    log = logging.getLogger("test_plan_handler")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.info("job", extra={"event": LogEvent.JOB_INFO, "rule_name": "train_run", "wildcards": {"run": "a"}})
    log.info("stats", extra={"event": LogEvent.RUN_INFO})
    log.removeHandler(handler)
    handler.close()
    handler.close()  # once
    assert seen == [[("train_run", {"run": "a"})]]
    silent = plan_log.DryRunPlan(seen.append)
    silent.close()  # nothing was listed (a DAG error): no plan
    assert len(seen) == 1
    broken = plan_log.DryRunPlan(lambda jobs: 1 / 0)
    broken.emit(logging.makeLogRecord({"msg": "Nothing to be done (all requested files are present)."}))
    broken.close()
    assert "plan: not priced: ZeroDivisionError" in capsys.readouterr().err


@pytest.mark.parametrize("argv,dry", [(["-n", "all"], True), (["-np", "x"], True),
                                      (["--dry-run"], True), (["-c2", "all"], False),
                                      (["--configfile", "c.yaml"], False)])
def test_is_dry_run(argv, dry):
    assert wf_plan.is_dry_run(argv) is dry


def test_marble_plan_runs_the_targets_dry_run_and_writes_json(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert plan_main(["--config", "config/paper.yaml", "--target", "rho_ablation", "--root", str(ROOT),
                      "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert re.search(r"rho_ablation: 5 runs x 16 GPUs: rho_07 \d+\.\d h, .* = \d+ GPU-h", printed)
    plan = json.loads(out.read_text())
    trained = sorted(j["name"] for j in plan["jobs"] if j["rule"] == "train_run")
    assert trained == sorted(RHO_RUNS)  # the target's runs only: no weighted_sum, no sequential
    assert plan["gpu_h"] > 0 and "utilisation (MFU)" in plan["gpu_throughput"]["source"]
    with pytest.raises(SystemExit, match="no such file"):
        plan_main(["--config", str(tmp_path / "none.yaml")])


@pytest.fixture(scope="module")
def clean_tree(tmp_path_factory):
    """The workflow without results: a dry run in the checkout itself would plan around the
    demo's results/ (`make demo`, then `make test`) and count fewer runs."""
    return copy_workflow(tmp_path_factory.mktemp("plan") / "repo", config=None)


def test_dry_run_of_paper_tables_plans_the_runs_and_prints_the_estimate(clean_tree):
    proc = snakemake(["-n", "paper_tables", "--configfile", "config/paper.yaml"], clean_tree)
    trained = re.findall(r"rule train_run:\n(?:\s+\S.*\n)*?\s+wildcards: run=(\S+)", proc.stdout)
    assert sorted(trained) == sorted(RHO_RUNS + ["weighted_sum", "sequential"])  # once each, no equal_alpha
    for rule in ("rho_ablation", "harmony", "cost", "paper_tables", "bench_step"):
        assert re.search(rf"^{rule}\s+1$", proc.stdout, re.MULTILINE), rule
    assert re.search(r"rho_ablation: 5 runs x 16 GPUs: rho_07 \d+\.\d h", proc.stderr)
    assert re.search(r"paper tables, each run once: 7 runs, \d+ GPU-h", proc.stderr)
    assert re.search(r"training: 7 runs, \d+ GPU-h", proc.stderr)
    # The staged run: 1600 steps of 40-step rollouts cost more than the weighted sum's 1000.
    hours = dict(re.findall(r"    (\w+) \(\w+\): \d+ steps x 16 GPUs x [\d.]+ h = (\d+) GPU-h", proc.stderr))
    assert int(hours["sequential"]) > 1.5 * int(hours["weighted_sum"])


def test_a_tables_line_adds_up_and_names_each_runs_hours(tmp_path):
    """`table1: 3 runs x 16 GPUs x 40.7 h = 1185` multiplied the longest run's hours: the line
    now gives each run's hours, and their sum x GPUs is the GPU-hours it prints."""
    jobs = [("train_run", {"run": r}) for r in ("rho_07", "weighted_sum", "sequential")] + [("table1", {})]
    result = plan_price.price(jobs, PAPER, tmp_path)
    line = next(x for x in plan_format.format_plan(result).splitlines() if x.startswith("  table1:"))
    hours = [float(h) for h in re.findall(r"(?:rho_07|weighted_sum|sequential) (\d+\.\d) h", line)]
    gpu_h = int(re.search(r"= (\d+) GPU-h$", line).group(1))
    assert len(hours) == 3 and len(set(hours)) > 1, line
    assert abs(16 * sum(hours) - gpu_h) <= 16 * 0.05 * 3 + 1, line  # each hour rounded to 0.1
    # Only the tables whose rule is listed: no rho_ablation or harmony line here.
    assert set(result["tables"]) == {"table1"}


def test_marble_plan_of_harmony_prints_only_harmony(capsys):
    """`--target harmony` trains weighted_sum and rho_07 (its inputs) and prints only its own
    table's line; `--configfile` is accepted like everywhere else (`--config` stays an alias)."""
    assert plan_main(["--configfile", "config/paper.yaml", "--target", "harmony", "--root", str(ROOT)]) == 0
    printed = capsys.readouterr().out
    assert re.search(r"^  harmony: 2 runs x 16 GPUs: rho_07 [\d.]+ h, weighted_sum [\d.]+ h = \d+ GPU-h$",
                     printed, re.MULTILINE), printed
    assert "training: 2 runs" in printed
    for other in ("table1:", "rho_ablation:", "paper tables, each run once"):
        assert other not in printed, printed


def test_dry_run_of_eval_only_prices_evaluation_only(clean_tree):
    proc = snakemake(["-n", "eval_only", "--configfile", "config/paper.yaml"], clean_tree)
    assert "rule train_run" not in proc.stdout
    err = proc.stderr
    assert "training: nothing to train" in err
    jobs = len(re.findall(r"^rule evaluate_ckpt:", proc.stdout, re.MULTILINE))
    match = re.search(r"evaluation: (\d+) jobs, (\d+) GPU-h", err)
    assert match and int(match.group(1)) == jobs > 0 and int(match.group(2)) > 0, err[-3000:]
    total = re.search(r"total: (\d+) GPU-h \(training 0, evaluation (\d+)\)", err)
    assert total and total.group(1) == total.group(2), err[-2000:]
    assert "utilisation (MFU)" in err and "judge" in err
