"""Each evaluation job's --time, sized from the plan, and the doctor's per-job comparison.

One `eval.resources.runtime` for every evaluation does not fit them all: the plan puts a
FLUX-dev GenEval job at 5.8 h and a PickScore job of SD3.5M at minutes, so a runtime that fits
the partition (the doctor's old suggestion, 60 min) let 9 of the paper's 36 evaluations run
out (TIMEOUT; evaluations do not requeue, and the profile's keep-going is false). Each
`evaluate_ckpt` job now asks for what the plan says it needs (`job_minutes`: the planned
hours x EVAL_MARGIN + EVAL_LOAD_MIN, never below the configured runtime), and `marble doctor`
compares each job's minutes with the partition / QOS limits it meets (`planned_jobs`).
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

from marble.workflow import evaluation as wf_eval
from marble.workflow import flops as wf_flops
from marble.workflow import plan_price
from marble.workflow.runs import configured

# The plan counts FLOPs at an assumed (or benched) throughput: half again as long covers a
# slower node or a busier filesystem; the load of the pipeline, rewards and judge is not counted.
EVAL_MARGIN = 1.5
EVAL_LOAD_MIN = 15


@functools.lru_cache(maxsize=4)
def _context(config_json: str, root: str):
    bench_file = Path(root) / "results/bench/step.json"  # the plan's default bench
    try:
        bench = json.loads(bench_file.read_text()) if bench_file.is_file() else None
    except ValueError:
        bench = None
    return plan_price.context(json.loads(config_json), Path(root), bench)


def planned_hours(config: dict, root, run: str, ckpt: str, dataset: str, settings: str | None = None) -> float | None:
    """The plan's wall hours of one evaluation job (None when the FLOP table lacks its shape)."""
    ctx = _context(json.dumps(config, sort_keys=True, default=str), str(root))
    settings = settings or wf_eval.row_settings(config["eval"], run, config["model_dir"])
    wildcards = {"run": run, "ckpt": ckpt, "dataset": dataset, "settings": settings}
    try:
        return plan_price.eval_job(wildcards, ctx).wall_h
    except (wf_flops.Missing, KeyError, ValueError):
        return None


def job_minutes(floor: int, hours: float | None) -> int:
    """An evaluation's --time: the plan's time with its margin, at least the configured one."""
    if hours is None:
        return floor
    return max(floor, math.ceil(hours * 60 * EVAL_MARGIN) + EVAL_LOAD_MIN)


def runtime_of(config: dict, root="."):
    """The `runtime` resource of rule evaluate_ckpt: a function of the job's wildcards."""
    floor = config["eval"]["resources"]["runtime"]

    def runtime(wildcards) -> int:
        return job_minutes(floor, planned_hours(config, root, wildcards.run, wildcards.ckpt,
                                                wildcards.dataset, wildcards.settings))
    return runtime


def planned_jobs(config: dict, root, trains: bool) -> list[tuple[str, float | None, int]]:
    """[(run/dataset, planned hours, its --time)] of every evaluation a target submits: the
    named checkpoints' rows, and the configured runs' when the target trains them."""
    ev = config.get("eval") or {}
    rows = list(configured(ev.get("checkpoints")))
    if trains:
        rows += [r for r in configured(config.get("runs")) if r not in rows]
    floor = (ev.get("resources") or {}).get("runtime", 0)
    out = []
    for row in rows:
        for dataset in wf_eval.row_protocol(ev, row)["datasets"]:
            hours = planned_hours(config, root, row, "final", dataset)
            out.append((f"{row}/{dataset}", hours, job_minutes(floor, hours)))
    return out
