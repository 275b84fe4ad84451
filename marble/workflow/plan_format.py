"""The priced plan as the lines a dry run prints and as JSON (`marble plan --json`)."""

from __future__ import annotations

from collections import defaultdict

from marble.evaluation.datasets import DATASETS
from marble.workflow import cost as wf_cost
from marble.workflow.plan_price import TRAINING_RULES


def duration(hours: float) -> str:
    """1.5 h, 12 min or 40 s: a tiny run's minutes stay readable beside a paper run's hours."""
    if hours >= 1:
        return f"{hours:.1f} h"
    return f"{hours * 60:.1f} min" if hours * 60 >= 1 else f"{hours * 3600:.0f} s"


def flop(x: float) -> str:
    """3.2 PFLOP, 710 GFLOP: the unit that keeps 1-3 digits before the point."""
    for unit, scale in (("EFLOP", 1e18), ("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9)):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{x / 1e6:.3g} MFLOP"


def _where(job: wf_cost.JobCost) -> str:
    return f"{job.gpus} GPUs" if job.gpus else "CPU (no GPU)"


def _cost(hours_each: float, jobs: list[wf_cost.JobCost]) -> str:
    """`14.4 h = 231 GPU-h` on GPUs; `1.3 min on the CPU` (no GPU-hours) otherwise."""
    if jobs[0].gpus:
        return f"{duration(hours_each)} = {sum(j.gpu_h for j in jobs):.0f} GPU-h"
    return f"{duration(hours_each)} on the CPU"


def _parts(flops: dict[str, float], per: float = 1.0) -> str:
    return ", ".join(f"{k} {flop(v / per)}" for k, v in flops.items() if v)


def _training_lines(train: list[wf_cost.JobCost], tables: dict) -> list[str]:
    if not train:
        return ["  training: nothing to train"]
    lines = [f"  training: {len(train)} runs, {sum(j.gpu_h for j in train):.0f} GPU-h"]
    for j in train:
        steps = j.detail["steps"]
        per = j.total_flops / max(steps, 1) / j.processes
        resumed = f" from step {j.detail['from_step']}" if j.detail["from_step"] else ""
        lines.append(f"    {j.name} ({j.detail['method']}): {steps} steps{resumed} x {_where(j)} x "
                     f"{_cost(j.wall_h, [j])}; per process and step {flop(per)} "
                     f"({_parts(j.flops, max(steps, 1) * j.processes)}) = "
                     f"{per / j.throughput.flops_per_s:.3g} s")
    by_name = {j.name: j for j in train if j.rule == "train_run"}
    shown = []
    for table, names in tables.items():
        rows = [by_name[n] for n in names if n in by_name]
        if rows:
            shown += [r.name for r in rows]
            # Each run's own hours, then their sum: runs differ in length (sequential's 1600
            # steps), so "3 runs x 40.7 h" of the longest did not add up to the GPU-hours.
            each = ", ".join(f"{r.name} {duration(r.wall_h)}" for r in rows)
            total = (f"{sum(r.gpu_h for r in rows):.0f} GPU-h" if rows[0].gpus else
                     f"{duration(sum(r.wall_h for r in rows))} one after another on the CPU")
            lines.append(f"  {table}: {len(rows)} runs x {_where(rows[0])}: {each} = {total}")
    once = [by_name[n] for n in dict.fromkeys(shown)]
    if once and len(once) < len(shown):  # a run shared by two of the tables shown
        lines.append(f"  paper tables, each run once: {len(once)} runs, " + (
            f"{sum(r.gpu_h for r in once):.0f} GPU-h" if once[0].gpus else
            f"{duration(sum(r.wall_h for r in once))} one after another on the CPU"))
    ckpt = [j for j in train if j.detail["checkpoints"]]
    if ckpt:
        j = max(ckpt, key=lambda j: j.extra_s)
        lines.append(f"  checkpoint writes (included): up to {j.detail['checkpoints']} x "
                     f"{j.detail['checkpoint_gb']:.2g} GB per run, {j.extra_s:.0f} s at an assumed "
                     f"{wf_cost.CHECKPOINT_WRITE_BPS / 1e9:.0f} GB/s "
                     f"({100 * j.extra_s / 3600 / max(j.wall_h, 1e-12):.2g}% of {j.name}'s time)")
    return lines


def _eval_lines(evals: list[wf_cost.JobCost]) -> list[str]:
    if not evals:
        return ["  evaluation: nothing to evaluate"]
    parts: dict[str, float] = defaultdict(float)
    for j in evals:
        for k, v in j.flops.items():
            parts[k] += v
    total = sum(parts.values())
    gpu_h = sum(j.gpu_h for j in evals)
    share = ", ".join(f"{k} {100 * v / total:.1f}%" for k, v in parts.items() if v)
    lines = [f"  evaluation: {len(evals)} jobs, {gpu_h:.0f} GPU-h, "
             f"{duration(sum(j.wall_h for j in evals))} one after another ({share} of {flop(total)})"]
    rows: dict[str, list] = defaultdict(list)
    for j in evals:
        rows[j.detail["row"]].append(j)
    for row, jobs in rows.items():
        datasets = sorted((j.detail["dataset"] for j in jobs), key=lambda d: (d not in DATASETS, d))
        lines.append(f"    {row}: {len(jobs)} jobs ({', '.join(datasets)}), "
                     f"{sum(j.detail['samples'] for j in jobs)} samples, "
                     f"{sum(j.gpu_h for j in jobs):.1f} GPU-h" if jobs[0].gpus else
                     f"    {row}: {len(jobs)} jobs, {duration(sum(j.wall_h for j in jobs))} on the CPU")
    if parts.get("judge"):
        lines.append("    judge and scorers: estimated as 2 x parameters x tokens "
                     "(marble/workflow/flops.py), not counted: a hypothesis until a GPU runs one")
    return lines


def format_plan(result: dict) -> str:
    jobs = result["jobs"]
    train = [j for j in jobs if j.rule in TRAINING_RULES]
    evals = [j for j in jobs if j not in train]
    lines = ["Plan: the jobs this run would start (finished ones cost nothing), priced from "
             "counted FLOPs (marble/workflow/flops_table.json, marble/workflow/cost.py)"]
    if any(j.gpus for j in jobs):
        lines.append(f"  GPU throughput: {result['gpu'].source}")
    if any(not j.gpus for j in jobs):
        lines.append(f"  CPU throughput: {result['cpu'].source}")
    lines += _training_lines(train, result["tables"]) + _eval_lines(evals)
    unpriced: dict[str, list[str]] = defaultdict(list)  # one line per reason, not per job
    for rule, name, why in result["unpriced"]:
        unpriced[why].append(f"{rule} {name}")
    for why, jobs_of in unpriced.items():
        names = ", ".join(dict.fromkeys(jobs_of))
        lines.append(f"  not priced: {len(jobs_of)} job(s), {why}: {names}")
    if result["other"]:
        lines.append("  other jobs (not priced: downloads, tables, bench, report): " + ", ".join(
            f"{rule} x{n}" for rule, n in sorted(result["other"].items())))
    for table, presets in result["missing_rows"].items():
        lines.append(f"  {table}: no configured run uses preset(s) {', '.join(presets)}: rows missing")
    lines.append(f"  total: {sum(j.gpu_h for j in jobs):.0f} GPU-h "
                 f"(training {sum(j.gpu_h for j in train):.0f}, evaluation {sum(j.gpu_h for j in evals):.0f})")
    return "\n".join(lines)


def plan_json(result: dict) -> dict:
    def job(j: wf_cost.JobCost) -> dict:
        return {"rule": j.rule, "name": j.name, "flops": j.flops, "total_flops": j.total_flops,
                "gpus": j.gpus, "processes": j.processes, "gpu_h": j.gpu_h, "wall_h": j.wall_h,
                "extra_s": j.extra_s, "throughput_flops_per_s": j.throughput.flops_per_s,
                "throughput_source": j.throughput.source, **j.detail}
    jobs = result["jobs"]
    return {"jobs": [job(j) for j in jobs], "gpu_h": sum(j.gpu_h for j in jobs),
            "unpriced": [list(u) for u in result["unpriced"]], "other": dict(result["other"]),
            "gpu_throughput": {"flops_per_s": result["gpu"].flops_per_s, "source": result["gpu"].source},
            "cpu_throughput": {"flops_per_s": result["cpu"].flops_per_s, "source": result["cpu"].source},
            "text": format_plan(result)}
