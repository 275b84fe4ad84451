"""Flat files for DVC: one metrics file per table, plot data DVC's templates can draw.

    python workflow/scripts/dvc_views.py --runs results/runs --eval-summary results/eval/summary.csv \
        --bench results/bench/step.json --out results/dvc

Writes (all atomically):
  eval_metrics.json    {"<run>/<checkpoint>": {"<metric> (<dataset>)": value}}  (`dvc metrics show`)
  bench_metrics.json   {"<balancer>": {"step_s", "peak_mb", "time_vs_weighted_sum"}}
  table1_metrics.json  {"<Table 1 row>": {"<metric>": ours}} (results/eval/table1.json; {} without one)
  curves/<reward>.csv  step, value, run: one file per reward (`dvc plots`: per-reward curves)
  eval_bars/<metric>.csv  run, value: one file per metric (`dvc plots`: per-run bars)
NaN (unscorable) is written as null in JSON and an empty cell in CSV, never as 0.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import re
import shutil
from pathlib import Path

from marble.runtime.io import json_text, read_jsonl, write_text


def _finite_or_none(value):
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def safe_name(text: str) -> str:
    """A file name from a metric or reward name (`reward/ocr` -> `ocr`)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "unnamed"


def eval_metrics(rows: list[dict]) -> dict[str, dict[str, float | None]]:
    """Long summary rows (run, checkpoint, dataset, metric, value) -> one flat table."""
    out: dict[str, dict[str, float | None]] = {}
    for row in rows:
        if row["metric"].startswith(("n_", "nan_", "na_")) or row["metric"] == "num_samples":
            continue  # counts, not scores
        key = f"{row['run']}/{row['checkpoint']}"
        out.setdefault(key, {})[f"{row['metric']} ({row['dataset']})"] = _finite_or_none(row["value"])
    return out


def eval_bars(metrics: dict[str, dict[str, float | None]]) -> dict[str, list[dict]]:
    """{metric: [{run, value}]}: one bar chart per metric, a bar per run/checkpoint."""
    bars: dict[str, list[dict]] = {}
    for run, values in sorted(metrics.items()):
        for metric, value in sorted(values.items()):
            bars.setdefault(metric, []).append({"run": run, "value": value})
    return bars


def training_curves(runs: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """{reward: [{step, value, run}]} from each run's metrics.jsonl (`reward/<name>` keys)."""
    curves: dict[str, list[dict]] = {}
    for run, records in sorted(runs.items()):
        for record in records:
            if "step" not in record:
                continue
            for key, value in record.items():
                if key.startswith("reward/"):
                    curves.setdefault(key[len("reward/"):], []).append(
                        {"step": int(record["step"]), "value": _finite_or_none(value), "run": run})
    return curves


def bench_metrics(bench: dict) -> dict[str, dict[str, float | None]]:
    balancers = bench.get("balancers", {})
    base = _finite_or_none(balancers.get("weighted_sum", {}).get("step_s"))
    out = {}
    for name, values in balancers.items():
        step = _finite_or_none(values.get("step_s"))
        out[name] = {"step_s": step, "peak_mb": _finite_or_none(values.get("peak_mb")),
                     "time_vs_weighted_sum": step / base if step is not None and base else None}
    return out


def _csv(rows: list[dict], fields: list[str]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if row[k] is None else row[k] for k in fields})
    return buf.getvalue()


def write_views(runs_dir: Path, summary: Path, bench: Path, out: Path, table1: Path | None = None) -> None:
    with open(summary, newline="", encoding="utf-8") as fh:
        metrics = eval_metrics(list(csv.DictReader(fh)))
    runs = {p.parent.name: [rec for _, rec in read_jsonl(p)]
            for p in sorted(runs_dir.glob("*/metrics.jsonl"))}
    if out.exists():
        shutil.rmtree(out)  # a reward or run that is gone must not leave a stale file
    write_text(out / "eval_metrics.json", json_text(metrics, indent=1, sort_keys=True) + "\n")
    write_text(out / "bench_metrics.json",
               json_text(bench_metrics(json.loads(bench.read_text(encoding="utf-8"))),
                          indent=1, sort_keys=True) + "\n")
    # Always written, so `dvc metrics show` never misses a declared file (tiny mode has no Table 1).
    rows = json.loads(table1.read_text(encoding="utf-8")) if table1 and table1.is_file() else {}
    write_text(out / "table1_metrics.json", json_text(rows, indent=1, sort_keys=True) + "\n")
    for reward, rows in training_curves(runs).items():
        write_text(out / "curves" / f"{safe_name(reward)}.csv", _csv(rows, ["step", "value", "run"]))
    for metric, rows in eval_bars(metrics).items():
        write_text(out / "eval_bars" / f"{safe_name(metric)}.csv", _csv(rows, ["run", "value"]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=Path, required=True)
    p.add_argument("--eval-summary", type=Path, required=True)
    p.add_argument("--bench", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--table1", type=Path, default=None, help="results/eval/table1.json, when written")
    args = p.parse_args(argv)
    write_views(args.runs, args.eval_summary, args.bench, args.out, args.table1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
