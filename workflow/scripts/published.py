"""Our evaluation of public checkpoints beside the paper's published rows, one line per metric.

    python workflow/scripts/published.py --eval-dir results/eval/<settings> \
        --published config/paper_published.yaml --out results/eval/paper_comparison.md

The table is marble.report.table1's (the one Table 1 builder: its ours, its guards); this
page lists it long, with ours - published per metric. A metric we did not evaluate is "–",
never 0; a published row we have no results for is listed as missing.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from marble.report import table1
from marble.report.published import load_published
from marble.runtime.io import write_text


def comparison(ours: dict[str, dict[str, float]], published: dict) -> list[dict]:
    """One record per (published row, metric): ours, paper, difference (None if absent)."""
    return table1.differences(table1.build(ours, published))


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--eval-dir", type=Path, required=True, action="append",
                   help="a settings folder (repeat: each row may have its own)")
    p.add_argument("--published", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--geneval", choices=sorted(table1.GENEVAL_AGGREGATES), default="task_mean")
    p.add_argument("--prompts", choices=table1.PROMPT_SETS, default="pickscore")
    args = p.parse_args(argv)
    published = load_published(args.published)
    try:
        ours = table1.ours_by_run(args.eval_dir, table1.Choice(args.geneval, args.prompts))
    except ValueError as exc:  # the builder's merge guards: one line in the job's log, no traceback
        raise SystemExit(f"published.py: error: {exc}") from None
    records = comparison(ours, published)
    write_text(args.out, render(records, published.get("source", str(args.published))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
