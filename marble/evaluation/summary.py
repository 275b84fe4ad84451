"""Aggregate evaluations into a long CSV and a Table-1-style table with the composite.

    python -m marble.evaluation.summary --eval-dir results/eval \
        --out-csv results/eval/summary.csv --out-md results/eval/table.md

Input: `<eval-dir>/<run>/<checkpoint>/<dataset>/average_scores.json` (from `marble evaluate`).
Table rows are run/checkpoint; columns are the paper's metrics that exist, each taken
from one dataset (below), then any other reward as `<reward> (<dataset>)` (toy rewards).
Scales follow the paper: PickScore x26 (our scorer returns score/26, docs/algorithm.md §3),
UnifiedReward
x5 (ours returns score/5, the paper reports 1-5). GenEval is the official overall (mean of
six per-tag accuracies) when all tags were evaluated, else the sample-mean accuracy, else
the partial-credit score.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import pandas as pd

from marble.evaluation.datasets import DRAWBENCH, GENEVAL, PICKSCORE
from marble.evaluation.results import RESULTS_FILE, ResultsError, read_results
from marble.rewards import descriptors
from marble.runtime.io import write_text
from marble.runtime.oserrors import print_write_failure
from marble.runtime.schema import is_number


# (column, candidate keys in order, datasets in order of preference, scale, decimals): each
# reward's descriptor's `column` (marble.rewards.catalogue), left to right.
_COLUMNS = sorted((d.column for d in descriptors() if d.column), key=lambda c: c.position)
PAPER_METRICS = [(c.label, c.keys, c.datasets, c.scale, c.places) for c in _COLUMNS]
PAPER_KEYS = {key for _, keys, _, _, _ in PAPER_METRICS for key in keys}
# The reference's evaluation writes three GenEval aggregates and does not say which the paper
# prints (issue 29): each is kept in average_scores.json; Table 1 takes the one selected
# (eval.table1_geneval) and its header names it.
GENEVAL_AGGREGATES = {"task_mean": "geneval_overall", "image_accuracy": "accuracy",
                      "partial_credit": GENEVAL}
# The model-based columns: the MARBLE evaluation scores them on both prompt sets; Table 1 takes
# one (eval.table1_prompts), the other set's numbers stay in the results.
MODEL_COLUMNS = tuple(c.label for c in _COLUMNS if c.model_based)
PROMPT_SETS = (PICKSCORE, DRAWBENCH)


def paper_metrics(geneval: str = "task_mean", prompts: str = PICKSCORE) -> list[tuple]:
    """PAPER_METRICS with one GenEval aggregate and one prompt set for the model-based
    columns, no fallback: a cell the selected protocol did not produce is NaN ("–")."""
    if geneval not in GENEVAL_AGGREGATES or prompts not in PROMPT_SETS:
        raise ValueError(f"GenEval aggregate {geneval!r} (one of {sorted(GENEVAL_AGGREGATES)}), "
                         f"prompt set {prompts!r} (one of {list(PROMPT_SETS)})")
    out = []
    for column, keys, datasets, scale, places in PAPER_METRICS:
        if column == "GenEval":
            keys = (GENEVAL_AGGREGATES[geneval],)
        elif column in MODEL_COLUMNS:
            datasets = (prompts,)
        out.append((column, keys, datasets, scale, places))
    return out
GENEVAL_DETAIL = ("accuracy", "strict_accuracy", "geneval_overall")
COMPOSITE = "Composite"


def composite_zscore(df: pd.DataFrame) -> pd.Series:
    """Per-row mean of column-wise z-scores (population std, ddof=0), as on the MARBLE page.

    Rows are models, columns metrics (higher is better). NaN cells are skipped: a column's
    mean/std use its finite cells, and a row averages the z-scores it has. A column with
    fewer than two finite values or zero spread says nothing about ranking and is left
    out (not counted as z = 0). A row with no usable z-score gets NaN.
    """
    values = df.apply(pd.to_numeric, errors="coerce")
    mean = values.mean(axis=0, skipna=True)
    std = values.std(axis=0, ddof=0, skipna=True)
    usable = (values.notna().sum(axis=0) >= 2) & (std > 0)
    z = (values.loc[:, usable] - mean[usable]) / std[usable]
    return z.mean(axis=1, skipna=True).rename(COMPOSITE)


def find_results(eval_dir: str | Path) -> list[tuple[str, str, str, Path]]:
    """(run, checkpoint, dataset, path) for every average_scores.json three levels down."""
    root = Path(eval_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"--eval-dir {root} does not exist")
    found = []
    for path in sorted(root.glob("*/*/*/average_scores.json")):
        dataset_dir = path.parent
        found.append((dataset_dir.parent.parent.name, dataset_dir.parent.name, dataset_dir.name, path))
    return found


def collect(eval_dir) -> pd.DataFrame:
    """Long table: run, checkpoint, dataset, metric, value (every numeric entry; null -> NaN).

    `eval_dir`: one settings folder or several (each Table 1 row has its own protocol, so its
    own folder); a run/checkpoint found in two of them is an error (two protocols, one row).
    """
    dirs = [eval_dir] if isinstance(eval_dir, (str, Path)) else list(eval_dir)
    found, seen = [], {}
    for folder in dirs:
        for run, checkpoint, dataset, path in find_results(folder):
            other = seen.setdefault((run, checkpoint), folder)
            if other != folder:
                raise ValueError(f"{run}/{checkpoint} is evaluated in both {other} and {folder}: "
                                 "summarise one settings folder per row")
            found.append((run, checkpoint, dataset, path))
    records = []
    for run, checkpoint, dataset, path in found:
        try:
            scores = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: invalid JSON: {exc}") from exc
        if not isinstance(scores, dict):
            raise ValueError(f"{path}: expected a JSON object of averages, got {type(scores).__name__}")
        check_recorded_count(path, scores)
        for metric, value in sorted(scores.items()):
            # Typed: a quoted "0.7" or a true was left out of the table without a word.
            if value is not None and not is_number(value):
                raise ValueError(f"{path}: `{metric}` = {value!r} is not a number or null; the file was edited, "
                                 "rerun `marble evaluate` into its folder")
            records.append((run, checkpoint, dataset, metric, math.nan if value is None else float(value)))
    return pd.DataFrame(records, columns=["run", "checkpoint", "dataset", "metric", "value"])


def check_recorded_count(path: Path, scores: dict) -> None:
    """The averages must come from the results beside them: every row valid (read_results:
    no duplicate, no non-finite score) and at least `num_samples` of them (a --limit run
    averages a subset, so more rows are fine; fewer means rows were removed or lost)."""
    results = path.parent / RESULTS_FILE
    if not results.is_file():
        return  # an averages-only folder (a published reference): nothing to compare with
    rows = read_results(results)
    recorded = scores.get("num_samples")
    if isinstance(recorded, int) and len(rows) < recorded:
        raise ResultsError(f"{path}: num_samples = {recorded}, but {results} holds {len(rows)} samples: "
                           "rows were removed or the files come from different runs; rerun `marble evaluate`")


def _reward_keys(metrics: set[str]) -> list[str]:
    """Keys that are reward means: those with an `n_<key>` count beside them."""
    return sorted(m for m in metrics if f"n_{m}" in metrics)


def _paper_value(cell: dict[tuple[str, str], float], keys, datasets, scale) -> float:
    for dataset in datasets:
        for key in keys:
            value = cell.get((dataset, key))
            if value is not None and math.isfinite(value):
                return value * scale
    return math.nan


def wide_table(long: pd.DataFrame, metrics: list[tuple] | None = None) -> tuple[pd.DataFrame, dict[str, int]]:
    """Rows `run/checkpoint`, metric columns + Composite; also each column's decimals.
    `metrics`: PAPER_METRICS (each column's first candidate present) or a paper_metrics()."""
    metrics = PAPER_METRICS if metrics is None else metrics
    decimals: dict[str, int] = {}
    rows: dict[str, dict[str, float]] = {}
    for (run, checkpoint), group in long.groupby(["run", "checkpoint"], sort=True):
        cell = {(d, m): v for d, m, v in zip(group["dataset"], group["metric"], group["value"])}
        row: dict[str, float] = {}
        for column, keys, datasets, scale, places in metrics:
            value = _paper_value(cell, keys, datasets, scale)
            if math.isfinite(value):
                row[column], decimals[column] = value, places
        for dataset, dgroup in group.groupby("dataset", sort=True):
            for key in _reward_keys(set(dgroup["metric"])):
                if key not in PAPER_KEYS and key not in GENEVAL_DETAIL:
                    row[f"{key} ({dataset})"] = cell[(dataset, key)]
                    decimals[f"{key} ({dataset})"] = 3
        rows[f"{run}/{checkpoint}"] = row
    paper_order = [c for c, *_ in PAPER_METRICS]
    table = pd.DataFrame.from_dict(rows, orient="index")
    columns = [c for c in paper_order if c in table.columns]
    columns += sorted(c for c in table.columns if c not in paper_order)
    table = table.reindex(columns=columns).dropna(axis=1, how="all")
    columns = list(table.columns)
    table.index.name = "model"
    if len(table):
        table[COMPOSITE] = composite_zscore(table[columns])
    decimals[COMPOSITE] = 2
    return table, decimals


def render_markdown(table: pd.DataFrame, decimals: dict[str, int]) -> str:
    def fmt(column: str, value) -> str:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "–"
        sign = "+" if column == COMPOSITE else ""
        return f"{value:{sign}.{decimals.get(column, 3)}f}"

    header = ["model", *table.columns]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, row in table.iterrows():
        lines.append("| " + " | ".join([str(name), *(fmt(c, row[c]) for c in table.columns)]) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m marble.evaluation.summary", description=__doc__.split("\n\n")[0])
    parser.add_argument("--eval-dir", required=True, action="append",
                        help="<eval-dir>/<run>/<checkpoint>/<dataset>/ (repeat for several settings folders)")
    parser.add_argument("--out-csv", required=True, help="long CSV: run,checkpoint,dataset,metric,value")
    parser.add_argument("--out-md", required=True, help="Table-1-style markdown table")
    args = parser.parse_args(argv)
    try:  # a results file that is not what it says (ResultsError is a ValueError), a missing folder
        long = collect(args.eval_dir)
        table, decimals = wide_table(long)
    except (ValueError, FileNotFoundError) as exc:
        print(f"marble eval summary: error: {exc}", file=sys.stderr)
        return 2
    markdown = render_markdown(table, decimals)
    try:
        write_text(args.out_csv, long.to_csv(index=False))
        write_text(args.out_md, markdown)
    except OSError as exc:  # a full disk or an output path under a file: one line, never a traceback
        return print_write_failure("marble eval summary", exc, Path(args.out_csv).parent)
    print(markdown, end="")
    print(f"{len(long)} values from {long.groupby(['run', 'checkpoint', 'dataset']).ngroups} evaluations")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
