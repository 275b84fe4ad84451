"""Table 1 as the paper prints it: every configured row, ours beside the published numbers.

    python -m marble.report.table1 --eval-dir results/eval/<settings> [--eval-dir ...] \
        --published config/paper_published.yaml --out-dir results/eval

Each published row names the run (`run:`) that produces it; its evaluations may live in any
of the settings folders (each row has its own protocol). Ours: the Table 1 metrics of that
run (marble.evaluation.summary's definitions and scales); the composite is recomputed over
the rows here, for ours and for the published values alike, so both compare the same set of
rows (over all 11 rows the published recomputation equals the page's). A row's `assumed:`
list (protocol values the paper does not state) is printed beside it, and so is any scorer
engine that is a stand-in (an ONNX OCR engine, from run_info.json). Writes table1.md,
table1.csv and table1.json (DVC metrics: {row: {metric: value}}).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pandas as pd

from marble.evaluation.summary import (
    COMPOSITE,
    PAPER_METRICS,
    collect,
    composite_zscore,
    wide_table,
)
from marble.runtime.io import write_text
from marble.report.published import load_published

METRICS = [c for c, *_ in PAPER_METRICS]
DECIMALS = {c: places for c, _, _, _, places in PAPER_METRICS} | {COMPOSITE: 2}


def ours_by_run(eval_dirs: list) -> dict[str, dict[str, float]]:
    """{run: {metric: value}} over every settings folder (one checkpoint per run)."""
    table, _ = wide_table(collect(eval_dirs)) if eval_dirs else (pd.DataFrame(), {})
    out: dict[str, dict[str, float]] = {}
    for key, row in table.iterrows():
        run = str(key).split("/")[0]
        if run in out:
            raise ValueError(f"run {run} has several evaluated checkpoints; Table 1 takes one per row")
        out[run] = {m: float(row[m]) for m in METRICS if m in table.columns and pd.notna(row[m])}
    return out


def stand_in_engines(eval_dirs: list) -> dict[str, set[str]]:
    """{run: engine labels that are not the paper's} from each evaluation's run_info.json
    (an ONNX OCR engine, say), so the table says which numbers came from a stand-in."""
    out: dict[str, set[str]] = {}
    for folder in eval_dirs:
        for info in Path(folder).glob("*/*/*/run_info.json"):
            scorers = json.loads(info.read_text(encoding="utf-8")).get("scorers") or {}
            for name, desc in scorers.items():
                engine = (desc or {}).get("engine") or ""
                if engine.split(":", 1)[-1].strip().startswith("ONNX"):
                    out.setdefault(info.parent.parent.parent.name, set()).add(f"{name}: {engine}")
    return out


def build(ours: dict[str, dict[str, float]], published: dict, engines: dict | None = None) -> pd.DataFrame:
    """One row per published row: ours and published per metric, both composites over these rows."""
    names = list(published["rows"])
    mine = pd.DataFrame([{m: ours.get(published["rows"][n]["run"], {}).get(m, math.nan) for m in METRICS}
                         for n in names], index=names)
    paper = pd.DataFrame([{m: published["rows"][n]["values"].get(m, math.nan) for m in METRICS}
                          for n in names], index=names)
    mine[COMPOSITE], paper[COMPOSITE] = composite_zscore(mine), composite_zscore(paper)
    frame = pd.concat({"ours": mine, "published": paper}, axis=1)
    frame.insert(0, ("", "run"), [published["rows"][n]["run"] for n in names])
    engines = engines or {}
    frame.insert(1, ("", "assumed"), ["; ".join([*(published["rows"][n].get("assumed") or []),
                                                 *sorted(engines.get(published["rows"][n]["run"], ()))])
                                      for n in names])
    frame.index.name = "row"
    return frame


def _fmt(metric: str, value) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    return f"{value:{'+' if metric == COMPOSITE else ''}.{DECIMALS.get(metric, 3)}f}"


def render(frame: pd.DataFrame, source: str) -> str:
    cols = [*METRICS, COMPOSITE]
    intro = (f"Published: {source}. Ours: this workflow's evaluation, each row under its own protocol "
             "(config eval.protocols). Cells are `ours / published`; composites are recomputed over "
             "the rows below; `–`: not evaluated.\n")
    lines = ["# Table 1: ours / published\n", intro,
             "| row | run | " + " | ".join(cols) + " | assumed |", "|" + "---|" * (len(cols) + 3)]
    for name, row in frame.iterrows():
        cells = [f"{_fmt(c, row[('ours', c)])} / {_fmt(c, row[('published', c)])}" for c in cols]
        lines.append(f"| {name} | {row[('', 'run')]} | " + " | ".join(cells) + f" | {row[('', 'assumed')] or ''} |")
    missing = [n for n in frame.index if frame.loc[n, ("ours", METRICS)].isna().all()]
    if missing:
        lines.append(f"\nNot evaluated yet: {', '.join(missing)}.")
    return "\n".join(lines) + "\n"


def report_frame(csv: Path) -> pd.DataFrame:
    """table1.csv (main's flat columns) as the report shows it: one row per published row,
    its run, and `ours / published` per metric, as table1.md's cells."""
    flat = pd.read_csv(csv, index_col="row")
    out = pd.DataFrame({"run": flat["run"]}, index=flat.index)
    for c in [*METRICS, COMPOSITE]:
        out[c] = [f"{_fmt(c, a)} / {_fmt(c, b)}" for a, b in zip(flat[f"ours: {c}"], flat[f"published: {c}"])]
    return out


def metrics(frame: pd.DataFrame) -> dict:
    """DVC metrics: {row: {metric: ours}} with finite values only (DVC cannot show NaN)."""
    out = {}
    for name, row in frame.iterrows():
        values = {c: float(row[("ours", c)]) for c in [*METRICS, COMPOSITE]
                  if math.isfinite(float(row[("ours", c)]))}
        out[str(name)] = values
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m marble.report.table1", description=__doc__.split("\n\n")[0])
    p.add_argument("--eval-dir", action="append", default=[], help="a settings folder (repeat)")
    p.add_argument("--published", type=Path, required=True)
    p.add_argument("--out-dir", type=Path, required=True)
    args = p.parse_args(argv)
    published = load_published(args.published)
    dirs = [d for d in args.eval_dir if Path(d).is_dir()]
    frame = build(ours_by_run(dirs), published, stand_in_engines(dirs))
    flat = frame.copy()
    flat.columns = [f"{a}: {b}" if a else b for a, b in frame.columns]
    write_text(args.out_dir / "table1.csv", flat.to_csv())
    text = render(frame, published.get("source", str(args.published)))
    write_text(args.out_dir / "table1.md", text)
    write_text(args.out_dir / "table1.json", json.dumps(metrics(frame), indent=1, sort_keys=True) + "\n")
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
