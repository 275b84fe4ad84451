"""The price of the jobs a plan runs: what `snakemake -n <target>` lists, nothing else.

`price(jobs, config, root, bench)` takes the (rule, wildcards) of each job Snakemake would
run (marble.workflow.plan_log collects them from the dry run itself), so a finished job is
not listed and costs nothing, and a target prices only its own jobs (`eval_only`: its
evaluations). Training jobs (`train_run`, `claim_run`) and evaluations (`evaluate_ckpt`,
the UnifiedReward judge inside the drawbench ones) are priced from counted FLOPs
(marble.workflow.cost); every other job is counted by rule, and a shape the FLOP table has
not counted is named, never priced as zero.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from marble.config import load_config
from marble.evaluation.datasets import DEFAULT_REWARDS, DRAWBENCH, GENEVAL, OCR, PICKSCORE
from marble.runtime.io import read_jsonl
from marble.training.checkpoint_format import list_checkpoints
from marble.workflow import claim as wf_claim
from marble.workflow import cost as wf_cost
from marble.workflow import evaluation as wf_eval
from marble.workflow import flops as wf_flops
from marble.workflow import plan as wf_plan
from marble.workflow import runs as wf_runs

TRAINING_RULES = ("train_run", "claim_run", "zoo_run")
EVAL_RULE = "evaluate_ckpt"
# Samples per dataset in the reference's prompt files (data/raw after `marble download`:
# GenEval's 553 prompts x 4, OCR's 1018, PickScore's 2048, DrawBench's 200 x 5), for a plan
# made before the download; once downloaded the files are counted.
REFERENCE_SAMPLES = {GENEVAL: 2212, OCR: 1018, PICKSCORE: 2048, DRAWBENCH: 1000}
# The mixed test split training's held-out evaluation reads (pickscore + ocr + geneval), for a
# plan made before the dataset is assembled; once it is, its rows are counted.
REFERENCE_TEST_ROWS = 2048 + 1018 + 2212


def test_rows(cfg, root: Path) -> int:
    """Rows of the run's data.test (parquet metadata only), else the reference's split."""
    path = root / cfg.data.test
    if not path.is_file():
        return REFERENCE_TEST_ROWS
    import pyarrow.parquet as pq  # deferred: only a plan of an assembled dataset reads one

    return pq.read_metadata(path).num_rows


@dataclass(frozen=True)
class Context:
    config: dict
    root: Path
    table: dict
    gpu: wf_cost.Throughput
    cpu: wf_cost.Throughput


def context(config: dict, root: Path, bench: dict | None, table: dict | None = None) -> Context:
    table = table if table is not None else wf_flops.load_table()
    gpu_type = (config.get("cluster") or {}).get("gpu_type")
    return Context(config, Path(root), table, wf_cost.gpu_throughput(bench, table, gpu_type),
                   wf_cost.cpu_throughput(bench, table))


def run_config(spec: dict, config: dict):
    """The marble.config.RunConfig a training job of this run spec trains (as its rule)."""
    spec = {"set": [], "max_steps": None, **spec}
    dataset_dir = f"data/datasets/{config['dataset']['name']}"
    overrides = wf_runs.run_overrides(spec, config["model_dir"], dataset_dir, None)
    if spec["max_steps"] is not None:
        overrides.append(f"train.max_steps={spec['max_steps']}")
    return load_config(spec["preset"], overrides=overrides)


def done_steps(run_dir: Path) -> int:
    """The step training resumes from: the newest checkpoint with its COMPLETE marker (not
    re-hashed here: a plan must not read gigabytes; resume verifies)."""
    found = list_checkpoints(run_dir)
    return found[-1][0] if found else 0


def measured_step_s(run_dir: Path) -> float | None:
    """Median `time/step_s` of a run folder's metrics.jsonl (None when it has none)."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return None
    times = [r["time/step_s"] for _, r in read_jsonl(path)
             if isinstance(r, dict) and isinstance(r.get("time/step_s"), (int, float))]
    return statistics.median(times) if times else None


def training_job(rule: str, name: str, ctx: Context) -> wf_cost.JobCost:
    if rule in ("claim_run", "zoo_run"):  # the claim's and the zoo's tiny runs: one CPU process each
        section, folder = ((ctx.config["claim"], wf_claim.CLAIM_DIR) if rule == "claim_run"
                           else (wf_claim.zoo_section(ctx.config), wf_claim.ZOO_DIR))
        spec, run_dir, gpus = wf_claim.runs(section)[name], ctx.root / folder / "runs" / name, 0
    else:
        train = ctx.config["train"]
        spec, run_dir = wf_runs.configured(ctx.config["runs"])[name], ctx.root / "results/runs" / name
        gpus = train["nodes"] * train["gpus_per_node"]
    cfg = run_config(spec, ctx.config)
    start = done_steps(run_dir)
    processes = max(gpus, 1)
    per_process = wf_cost.training_flops(cfg, ctx.table, start)
    throughput = ctx.gpu if gpus else ctx.cpu
    own = measured_step_s(run_dir)
    steps = cfg.train.max_steps - start
    if own and steps:  # this run's own pace: its FLOPs per step over its median step time
        rate = sum(per_process.values()) / steps / own
        throughput = wf_cost.Throughput(rate, bool(gpus), f"measured: {name}'s own median "
                                        f"time/step_s {own:.3g} s = {rate / 1e12:.4g} TFLOP/s")
    if cfg.train.eval_every:  # after the pace above: a run's time/step_s holds no evaluation
        per_process["held-out evaluation"] = wf_cost.heldout_flops(
            cfg, ctx.table, test_rows(cfg, ctx.root), processes, start)
    ckpt_s, ckpts, gb = wf_cost.checkpoint_seconds(cfg, ctx.table, start)
    return wf_cost.JobCost(rule, name, {k: v * processes for k, v in per_process.items()}, gpus,
                           throughput, processes, ckpt_s,
                           {"steps": steps, "from_step": start, "checkpoints": ckpts,
                            "checkpoint_gb": gb, "method": cfg.balancer.method})


def eval_samples(raw_dir: Path, dataset: str, limit: int | None) -> tuple[int, str]:
    """(samples, where the count comes from) of one dataset's evaluation."""
    from marble.evaluation.prompts import dataset_file  # its readers load pandas and torch

    path = dataset_file(raw_dir, dataset)
    if path.is_file():
        with open(path, encoding="utf-8") as f:
            n, source = sum(1 for line in f if line.strip()), str(path)
    else:
        n, source = REFERENCE_SAMPLES[dataset], "the reference's prompt files (not downloaded yet)"
    return (min(n, limit) if limit else n), source


def eval_job(wildcards: dict, ctx: Context) -> wf_cost.JobCost:
    ev, dataset = ctx.config["eval"], wildcards["dataset"]
    row = wf_eval.row_protocol(ev, wildcards["run"])
    samples, source = eval_samples(ctx.root / ctx.config["raw_dir"], dataset, row.get("limit"))
    out = ctx.root / "results/eval" / wildcards["settings"] / wildcards["run"] / wildcards["ckpt"] / dataset
    done = out / "evaluation_results.jsonl"  # one line per finished sample; a rerun skips them
    if done.is_file():
        with open(done, encoding="utf-8") as f:
            samples = max(0, samples - sum(1 for line in f if line.strip()))
    rewards = list(ev["rewards"].get(dataset) or DEFAULT_REWARDS[dataset])
    parts = wf_cost.eval_flops(row, dataset, samples, ctx.config["mode"], rewards, ctx.table)
    gpus = (ev.get("resources") or {}).get("gpus") or 0
    name = f"{wildcards['run']}/{wildcards['ckpt']}/{dataset}"
    return wf_cost.JobCost(EVAL_RULE, name, parts, gpus, ctx.gpu if gpus else ctx.cpu,
                           max(wf_eval.processes(ev), 1) if gpus else 1,
                           detail={"samples": samples, "samples_from": source,
                                   "row": wildcards["run"], "dataset": dataset})


def price(jobs: list[tuple[str, dict]], config: dict, root: Path, bench: dict | None = None,
          table: dict | None = None) -> dict:
    """{"jobs": [JobCost], "unpriced": [(rule, name, why)], "other": Counter(rule), ...};
    `table`: the FLOP table (default: the stored one)."""
    ctx = context(config, root, bench, table)
    priced, unpriced, other = [], [], Counter()
    for rule, wildcards in jobs:
        name = wildcards.get("run") or wildcards.get("claimrun") or wildcards.get("zoorun") or ""
        try:
            if rule in TRAINING_RULES:
                priced.append(training_job(rule, name, ctx))
            elif rule == EVAL_RULE:
                priced.append(eval_job(wildcards, ctx))
            else:
                other[rule] += 1
        except wf_flops.Missing as exc:
            unpriced.append((rule, name, str(exc)))
    # Snakemake lists jobs in no fixed order: config order (runs, then evaluated rows) reads better.
    order = [*(config.get("runs") or {}), *((config.get("eval") or {}).get("checkpoints") or {})]
    rank = {name: i for i, name in enumerate(order)}
    priced.sort(key=lambda j: (j.rule != "train_run", j.rule, rank.get(j.detail.get("row", j.name), len(rank)),
                               j.name))
    # Only the tables this target builds (their rule is among the listed jobs): `harmony`
    # prints harmony's runs, not Table 1's or the ablation's.
    runs = wf_runs.configured(config["runs"])
    built = {t: names for t, names in wf_plan.table_runs(runs, config["mode"]).items() if other.get(t)}
    missing = {t: presets for t, presets in wf_plan.missing_rows(runs, config["mode"]).items() if other.get(t)}
    return {"jobs": priced, "unpriced": unpriced, "other": other, "gpu": ctx.gpu, "cpu": ctx.cpu,
            "tables": built, "missing_rows": missing}
