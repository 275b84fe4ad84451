"""Our evaluation of public checkpoints beside the paper's published rows.

    python workflow/scripts/published.py --eval-dir results/eval/<settings> \
        --published config/paper_published.yaml --out results/eval/paper_comparison.md

For each published row whose `run` we evaluated: ours, published, and ours - published
per metric (the Table-1 columns of marble.evaluation.summary). A metric we did not evaluate is
"–", never 0; a published row we have no results for is listed as missing.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from marble.evaluation.summary import PAPER_METRICS, collect, wide_table
from marble.runtime.io import write_text
from marble.report.published import load_published

COLUMNS = [c for c, *_ in PAPER_METRICS]


def comparison(ours: dict[str, dict[str, float]], published: dict) -> list[dict]:
    """One record per (published row, metric): ours, paper, difference (None if absent).
    `ours` maps our run name to its Table-1 values (the run's single checkpoint)."""
    records = []
    for name, row in published["rows"].items():
        mine = ours.get(row["run"])
        for metric in COLUMNS:
            if metric not in row["values"]:
                continue
            paper = float(row["values"][metric])
            value = None if mine is None else mine.get(metric)
            if value is not None and not math.isfinite(value):
                value = None
            records.append({"row": name, "run": row["run"], "metric": metric, "ours": value,
                            "paper": paper, "diff": None if value is None else value - paper})
    return records


def render(records: list[dict], source: str) -> str:
    def fmt(v, signed=False):
        return "–" if v is None else (f"{v:+.3f}" if signed else f"{v:.3f}")

    lines = ["# Our evaluation beside the published numbers\n",
             f"Published: {source}. Ours: this workflow's evaluation of the same checkpoints.\n",
             "| row | metric | ours | published | ours - published |", "|---|---|---|---|---|"]
    for r in records:
        lines.append(f"| {r['row']} | {r['metric']} | {fmt(r['ours'])} | {fmt(r['paper'])} "
                     f"| {fmt(r['diff'], signed=True)} |")
    missing = sorted({r["row"] for r in records if r["ours"] is None})
    if missing:
        lines.append(f"\nNot (fully) evaluated here: {', '.join(missing)}.")
    return "\n".join(lines) + "\n"


def ours_by_run(eval_dir) -> dict[str, dict[str, float]]:
    table, _ = wide_table(collect(eval_dir))
    out: dict[str, dict[str, float]] = {}
    for key, row in table.iterrows():
        run = str(key).split("/")[0]
        if run in out:
            raise ValueError(f"{eval_dir}: run {run} has several checkpoints; compare one")
        out[run] = {c: float(row[c]) for c in table.columns if c in COLUMNS}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--eval-dir", type=Path, required=True, action="append",
                   help="a settings folder (repeat: each row may have its own)")
    p.add_argument("--published", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    published = load_published(args.published)
    write_text(args.out, render(comparison(ours_by_run(args.eval_dir), published),
                                published.get("source", str(args.published))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
