"""`marble plan`: the runs a workflow config trains per paper table, and what they cost.

    marble plan --config config/paper.yaml [--bench results/bench/step.json] [--runs-dir results/runs]

Prints, per table, "N runs x G GPUs x H h = X GPU-h" and the total (each run once), with
where the seconds per step come from (marble/workflow/cost.py). A Snakemake dry run
(`snakemake -n ...`) prints the same lines.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from marble.workflow import configs as wf_configs
from marble.workflow import cost as wf_cost
from marble.workflow import plan as wf_plan
from marble.workflow import runs as wf_runs


def measured_step_s(run_dir: Path) -> float | None:
    """Median `time/step_s` of a run folder's metrics.jsonl (None when it has none)."""
    from marble.runtime.io import read_jsonl

    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return None
    times = [r["time/step_s"] for _, r in read_jsonl(path)
             if isinstance(r, dict) and isinstance(r.get("time/step_s"), (int, float))]
    return statistics.median(times) if times else None


def estimate(config: dict, bench: dict | None = None, runs_dir: Path | None = None):
    """(plan dict, {run: RunCost}, by_table) for a validated workflow config."""
    from marble.config import load_config

    runs, mode = wf_runs.configured(config["runs"]), config["mode"]
    by_table = wf_plan.table_runs(runs, mode)
    others = [r for r in runs if r not in wf_plan.planned_runs(by_table)]
    if others:  # trained by `all`, in no paper table: still on the bill
        by_table[wf_cost.OTHER] = others
    dataset_dir = f"data/datasets/{config['dataset']['name']}"
    embed = f"{dataset_dir}/embeddings" if config["dataset"].get("embed") else None
    geometry = (config["train"]["nodes"], config["train"]["gpus_per_node"])
    costs = {}
    for name in wf_plan.planned_runs(by_table):
        spec = runs[name]
        overrides = wf_runs.run_overrides(spec, config["model_dir"], dataset_dir, embed)
        if spec.get("max_steps") is not None:
            overrides.append(f"train.max_steps={spec['max_steps']}")
        shape = wf_cost.run_shape(load_config(spec["preset"], overrides=overrides))
        measured = measured_step_s(runs_dir / name) if runs_dir else None
        costs[name] = wf_cost.run_cost(name, shape, geometry, bench, measured)
    return wf_cost.plan_cost(by_table, costs), costs, by_table


def plan_text(config: dict, bench: dict | None = None, runs_dir: Path | None = None) -> str:
    plan, costs, _ = estimate(config, bench, runs_dir)
    gpus = config.get("bench", {}).get("resources", {}).get("gpus") or 0
    note = f"the bench: one {gpus}-GPU job" if gpus else "the bench: one CPU job"
    text = wf_cost.format_plan(plan, costs, note)
    missing = wf_plan.missing_rows(wf_runs.configured(config["runs"]), config["mode"])
    for table, presets in missing.items():
        text += f"\n  {table}: no configured run uses preset(s) {', '.join(presets)}: rows missing"
    return text


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="marble plan", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=Path, default=Path("config.yaml"), help="workflow config")
    p.add_argument("--bench", type=Path, help="`marble bench step` JSON (a measured step time)")
    p.add_argument("--runs-dir", type=Path, default=Path("results/runs"),
                   help="run folders whose own step times are used when present")
    p.add_argument("--json", type=Path, help="also write the plan as JSON here")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not args.config.is_file():
        raise SystemExit(f"marble plan: --config {args.config}: no such file")
    config = wf_configs.load([args.config])  # an overlay gets its `overlay_on:` base
    for key in ("mode", "runs", "train", "dataset", "model_dir"):
        if key not in config:
            raise SystemExit(f"marble plan: {args.config}: missing key `{key}`")
    for spec in wf_runs.configured(config["runs"]).values():
        spec.setdefault("set", [])
        spec.setdefault("max_steps", None)
    bench = json.loads(args.bench.read_text(encoding="utf-8")) if args.bench and args.bench.is_file() else None
    print(f"{args.config}:")
    print(plan_text(config, bench, args.runs_dir))
    if args.json:
        from marble.runtime.io import write_json

        plan, costs, _ = estimate(config, bench, args.runs_dir)
        plan["step_time"] = {n: {"seconds": c.step.seconds, "source": c.step.source}
                             for n, c in costs.items()}
        write_json(args.json, plan)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
