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
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from marble.evaluation.datasets import PICKSCORE
from marble.evaluation.summary import (
    COMPOSITE,
    GENEVAL_AGGREGATES,
    MODEL_COLUMNS,
    PAPER_METRICS,
    PROMPT_SETS,
    collect,
    composite_zscore,
    paper_metrics,
    wide_table,
)
from marble.runtime.io import write_text
from marble.report.published import load_published

METRICS = [c for c, *_ in PAPER_METRICS]
DECIMALS = {c: places for c, _, _, _, places in PAPER_METRICS} | {COMPOSITE: 2}
# Alternatives kept beside the compared numbers (csv, json), not in the printed table.
ALT = "alt: "


@dataclass(frozen=True)
class Choice:
    """Which of the reference's open choices stands beside the paper's number (issue 29):
    the GenEval aggregate (eval.table1_geneval) and the prompt set of the five model-based
    columns (eval.table1_prompts)."""

    geneval: str = "task_mean"
    prompts: str = PICKSCORE

    def label(self, metric: str) -> str:
        """The column header that names the choice: `GenEval (task mean)`, `PickScore (pickscore prompts)`."""
        if metric == "GenEval":
            return f"GenEval ({self.geneval.replace('_', ' ')})"
        return f"{metric} ({self.prompts} prompts)" if metric in MODEL_COLUMNS else metric


def run_values(long: pd.DataFrame, choice: Choice = Choice()) -> dict[str, float]:
    """One evaluated checkpoint's values, the one definition every Table 1 view uses: the
    paper's metrics (summary.paper_metrics(choice): each from its one dataset, on the paper's
    scale) and any other reward (a toy one) as `<reward> (mean over datasets)`, so a view stays
    one column per reward. `long`: marble.evaluation.summary.collect rows of one run/checkpoint."""
    if long.empty:
        return {}
    if long.groupby(["run", "checkpoint"]).ngroups != 1:
        raise ValueError("run_values takes the rows of one run/checkpoint")
    wide = wide_table(long, paper_metrics(choice.geneval, choice.prompts))[0]
    row = wide.iloc[0].drop(labels=[COMPOSITE], errors="ignore")
    out = {m: float(row[m]) for m in METRICS if m in row.index and pd.notna(row[m])}
    others: dict[str, list[float]] = {}
    for key, value in row.items():
        if key not in METRICS and pd.notna(value):
            others.setdefault(str(key).rsplit(" (", 1)[0] + " (mean over datasets)", []).append(float(value))
    return out | {k: sum(v) / len(v) for k, v in others.items()}


def alternatives(long: pd.DataFrame, choice: Choice) -> dict[str, float]:
    """The numbers the other choices give (the other GenEval aggregates, the other prompt
    set's model-based columns), as `alt: <label>` keys: kept in table1.csv/json."""
    out = {}
    for name in GENEVAL_AGGREGATES:
        if name != choice.geneval:
            other = Choice(name, choice.prompts)
            out[ALT + other.label("GenEval")] = run_values(long, other).get("GenEval", math.nan)
    for prompts in PROMPT_SETS:
        if prompts != choice.prompts:
            other = Choice(choice.geneval, prompts)
            values = run_values(long, other)
            out.update({ALT + other.label(c): values.get(c, math.nan) for c in MODEL_COLUMNS})
    return {k: v for k, v in out.items() if math.isfinite(v)}


def ours_by_run(eval_dirs: list, choice: Choice | None = None) -> dict[str, dict[str, float]]:
    """{run: run_values} over every settings folder. Guards: a run/checkpoint evaluated in two
    settings folders (two protocols for one row) and a run with several evaluated checkpoints
    (Table 1 takes one per row) are errors, never a silent pick. With a `choice`, each run's
    alternatives (the other choices' numbers) come along."""
    long = collect(eval_dirs) if eval_dirs else pd.DataFrame(columns=["run", "checkpoint"])
    out: dict[str, dict[str, float]] = {}
    for run, group in long.groupby("run", sort=True):
        checkpoints = sorted(set(group["checkpoint"]))
        if len(checkpoints) > 1:
            raise ValueError(f"run {run} has several evaluated checkpoints ({', '.join(checkpoints)}); "
                             "Table 1 takes one per row")
        out[str(run)] = run_values(group, choice or Choice())
        if choice is not None:
            out[str(run)] |= alternatives(group, choice)
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
    """THE Table 1: one row per published row (`published["rows"]`: {name: {run, values}}),
    `ours` (per run, run_values) and `published` per metric, both composites recomputed over
    these rows. Columns: ("", run), ("", assumed), then ("ours"|"published", metric) for the
    paper's metrics, Composite, and any other reward ours has (published: NaN)."""
    names = list(published["rows"])
    runs = [published["rows"][n]["run"] for n in names]
    extra = sorted({k for r in runs for k in ours.get(r, {}) if k not in METRICS})
    mine = pd.DataFrame([{m: ours.get(r, {}).get(m, math.nan) for m in METRICS} for r in runs],
                        index=names, columns=METRICS, dtype=float)
    paper = pd.DataFrame([{m: published["rows"][n]["values"].get(m, math.nan) for m in METRICS}
                          for n in names], index=names, columns=METRICS, dtype=float)
    mine[COMPOSITE], paper[COMPOSITE] = composite_zscore(mine), composite_zscore(paper)
    for key in extra:
        mine[key] = [ours.get(r, {}).get(key, math.nan) for r in runs]
        paper[key] = math.nan
    frame = pd.concat({"ours": mine, "published": paper}, axis=1)
    frame.insert(0, ("", "run"), runs)
    engines = engines or {}
    frame.insert(1, ("", "assumed"), ["; ".join([*(published["rows"][n].get("assumed") or []),
                                                 *sorted(engines.get(published["rows"][n]["run"], ()))])
                                      for n in names])
    frame.index.name = "row"
    return frame


def columns(frame: pd.DataFrame) -> list[str]:
    """The metric columns of a built table, in order."""
    return [c for side, c in frame.columns if side == "ours"]


def differences(frame: pd.DataFrame) -> list[dict]:
    """One record per (row, metric with a published number, Composite left out): ours,
    paper, ours - paper (None where ours is missing), for the workflow's comparison page."""
    records = []
    for name, row in frame.iterrows():
        for metric in METRICS:
            paper = float(row[("published", metric)])
            if not math.isfinite(paper):
                continue
            value = float(row[("ours", metric)])
            value = value if math.isfinite(value) else None
            records.append({"row": name, "run": row[("", "run")], "metric": metric, "ours": value,
                            "paper": paper, "diff": None if value is None else value - paper})
    return records


def long_form(frame: pd.DataFrame, basis: dict[str, str], source: str) -> pd.DataFrame:
    """The report's long frame (row, metric, ours, published, basis, source) of a built table."""
    rows = []
    for name, row in frame.iterrows():
        for metric in columns(frame):
            paper = row[("published", metric)]
            rows.append({"row": name, "metric": metric, "ours": row[("ours", metric)],
                         "published": paper, "basis": basis.get(name, ""),
                         "source": source if pd.notna(paper) else ""})
    return pd.DataFrame(rows, columns=["row", "metric", "ours", "published", "basis", "source"])


def _fmt(metric: str, value) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    return f"{value:{'+' if metric == COMPOSITE else ''}.{DECIMALS.get(metric, 3)}f}"


def render(frame: pd.DataFrame, source: str, choice: Choice = Choice()) -> str:
    cols = [c for c in columns(frame) if not c.startswith(ALT)]
    intro = (f"Published: {source}. Ours: this workflow's evaluation, each row under its own protocol "
             "(config eval.protocols). Cells are `ours / published`; composites are recomputed over "
             "the rows below; `–`: not evaluated. GenEval: the "
             f"{choice.geneval.replace('_', ' ')} (eval.table1_geneval); the five model-based columns: "
             f"the {choice.prompts} prompts (eval.table1_prompts); the other choices' numbers are in "
             "table1.csv and table1.json (`alt:` columns).\n")
    lines = ["# Table 1: ours / published\n", intro,
             "| row | run | " + " | ".join(choice.label(c) for c in cols) + " | assumed |",
             "|" + "---|" * (len(cols) + 3)]
    for name, row in frame.iterrows():
        cells = [f"{_fmt(c, row[('ours', c)])} / {_fmt(c, row[('published', c)])}" for c in cols]
        lines.append(f"| {name} | {row[('', 'run')]} | " + " | ".join(cells) + f" | {row[('', 'assumed')] or ''} |")
    missing = [n for n in frame.index if frame.loc[n, [("ours", c) for c in cols]].isna().all()]
    if missing:
        lines.append(f"\nNot evaluated yet: {', '.join(missing)}.")
    return "\n".join(lines) + "\n"


def report_frame(csv: Path) -> pd.DataFrame:
    """table1.csv (main's flat columns) as the report shows it: one row per published row,
    its run, and `ours / published` per metric, as table1.md's cells."""
    flat = pd.read_csv(csv, index_col="row")
    out = pd.DataFrame({"run": flat["run"]}, index=flat.index)
    for label in [name.split(": ", 1)[1] for name in flat.columns if name.startswith("ours: ")]:
        if label.startswith(ALT):
            continue  # the other choices' numbers: in the csv, not in the printed table
        c = label.split(" (", 1)[0] if label.split(" (", 1)[0] in METRICS else label
        out[label] = [f"{_fmt(c, a)} / {_fmt(c, b)}"
                      for a, b in zip(flat[f"ours: {label}"], flat[f"published: {label}"])]
    return out


def metrics(frame: pd.DataFrame) -> dict:
    """DVC metrics: {row: {metric: ours}} with finite values only (DVC cannot show NaN)."""
    out = {}
    for name, row in frame.iterrows():
        values = {c: float(row[("ours", c)]) for c in columns(frame)
                  if math.isfinite(float(row[("ours", c)]))}
        out[str(name)] = values
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m marble.report.table1", description=__doc__.split("\n\n")[0])
    p.add_argument("--eval-dir", action="append", default=[], help="a settings folder (repeat)")
    p.add_argument("--published", type=Path, required=True)
    p.add_argument("--out-dir", type=Path, required=True)
    p.add_argument("--geneval", choices=sorted(GENEVAL_AGGREGATES), default="task_mean",
                   help="the GenEval aggregate beside the paper's number (eval.table1_geneval)")
    p.add_argument("--prompts", choices=PROMPT_SETS, default=PICKSCORE,
                   help="the prompt set of the five model-based columns (eval.table1_prompts)")
    args = p.parse_args(argv)
    choice = Choice(args.geneval, args.prompts)
    published = load_published(args.published)
    dirs = [d for d in args.eval_dir if Path(d).is_dir()]
    try:
        ours = ours_by_run(dirs, choice)
    except ValueError as exc:  # a merge guard (two protocols or two checkpoints for a row): one line
        raise SystemExit(f"python -m marble.report.table1: error: {exc}") from None
    frame = build(ours, published, stand_in_engines(dirs))
    flat = frame.copy()
    # The csv's headers name the choice (the report's HTML Table 1 is read from it).
    flat.columns = [f"{a}: {choice.label(b)}" if a else b for a, b in frame.columns]
    write_text(args.out_dir / "table1.csv", flat.to_csv())
    text = render(frame, published.get("source", str(args.published)), choice)
    write_text(args.out_dir / "table1.md", text)
    write_text(args.out_dir / "table1.json", json.dumps(metrics(frame), indent=1, sort_keys=True) + "\n")
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
