"""Read what the pipeline wrote: run folders, the eval summary, bench JSON, eval images.

Every reader names the file (and line) it could not parse. Missing optional inputs are
not errors here: callers get `None` and the report says what is missing.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from marble.config_stages import STAGED_KIND
from marble.runtime.io import read_jsonl
from marble.runtime.schema import check_metrics_line, check_result_row

IMAGE_SUFFIXES = (".jpg", ".png")


class ReportInputError(ValueError):
    """An input file exists but cannot be read; the message names file and line."""


@dataclass
class RunData:
    name: str
    path: Path
    config: dict[str, Any]
    metrics: pd.DataFrame  # one row per optimizer step, sorted by `step`
    summary: dict[str, Any] = field(default_factory=dict)
    evals: pd.DataFrame | None = None  # eval.jsonl: one row per held-out evaluation (None: none)

    @property
    def balancer(self) -> str:
        if self.config.get("stages"):
            # A staged run is its own method (Table 1's "sequential"), never pooled with the
            # joint runs of its stages' balancer (the verdict compares weighted sum and MARBLE).
            return STAGED_KIND
        method = (self.config.get("balancer") or {}).get("method")
        if method:
            return str(method)
        if "balancer" in self.metrics and self.metrics["balancer"].notna().any():
            return str(self.metrics["balancer"].dropna().iloc[-1])
        return "unknown"

    @property
    def reward_names(self) -> list[str]:
        names = [r.get("name") for r in self.config.get("rewards") or [] if r.get("name")]
        if names:
            return names
        return sorted(c.split("/", 1)[1] for c in self.metrics.columns if c.startswith("reward/"))

    @property
    def max_steps(self) -> int | None:
        """train.max_steps of its config.yaml (None without one)."""
        value = (self.config.get("train") or {}).get("max_steps")
        return None if value is None else int(value)

    @property
    def seed(self) -> int | None:
        """train.seed of its config.yaml (None without an integer one)."""
        seed = (self.config.get("train") or {}).get("seed")
        return seed if isinstance(seed, int) and not isinstance(seed, bool) else None

    @property
    def alpha_ema(self) -> float | None:
        value = (self.config.get("balancer") or {}).get("alpha_ema")
        return None if value is None else float(value)


def read_metrics(path: Path) -> pd.DataFrame:
    """metrics.jsonl (or eval.jsonl) -> DataFrame; null -> NaN; a step logged twice (resume)
    keeps the last."""
    records = []
    for lineno, record in read_jsonl(path, ReportInputError):
        # Typed: a quoted number was coerced, and text became a silent NaN (a missing point).
        records.append(check_metrics_line(record, f"{path}:{lineno}", ReportInputError))
    frame = pd.DataFrame.from_records(records)
    if frame.empty:
        return pd.DataFrame({"step": pd.Series(dtype=float)})
    for col in frame.columns:
        # text columns, and the per-micro-step records of a diagnostic step (lists of objects,
        # marble/balancers/levels.py) that the claim's theorem reads
        if col not in ("balancer", "stage_name", "eval_id", "diag_micro"):
            frame[col] = pd.to_numeric(frame[col], errors="coerce")
    frame = frame.drop_duplicates("step", keep="last").sort_values("step")
    return frame.reset_index(drop=True)



def load_run(path: Path) -> RunData:
    metrics_path = path / "metrics.jsonl"
    if not metrics_path.is_file():
        raise ReportInputError(f"{path}: no metrics.jsonl")
    config: dict[str, Any] = {}
    if (path / "config.yaml").is_file():
        try:
            config = yaml.safe_load((path / "config.yaml").read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as exc:
            raise ReportInputError(f"{path / 'config.yaml'}: invalid YAML: {exc}") from exc
    summary: dict[str, Any] = {}
    if (path / "train_summary.json").is_file():
        summary = _read_json(path / "train_summary.json")
    evals = read_metrics(path / "eval.jsonl") if (path / "eval.jsonl").is_file() else None
    return RunData(path.name, path, config, read_metrics(metrics_path), summary, evals)


def run_folders(runs_dir: Path) -> list[Path]:
    """The sub-folders of `runs_dir` holding a metrics.jsonl, sorted by name; hidden ones
    are not runs (`marble train --fresh` keeps a replaced run as `.<name>.replaced-<time>`:
    listed, it would show as a current run)."""
    if not runs_dir.is_dir():
        raise ReportInputError(f"--runs {runs_dir}: not a directory")
    return sorted(p for p in runs_dir.iterdir()
                  if not p.name.startswith(".") and (p / "metrics.jsonl").is_file())


def incomplete_reason(run: RunData) -> str | None:
    """Why a run is not complete (None when it is): its metrics stop short of its config's
    `train.max_steps` (a run still training, stopped or killed). Averaged in, its early curve
    stood beside finished runs' in the verdict as if it were one. A train_summary.json (written
    only when training ended) or a config without max_steps says complete, the latter as before.
    Steps are logged every `train.log_every`: the last one logged may fall short of max_steps."""
    if run.max_steps is None or (run.path / "train_summary.json").is_file():
        return None
    steps = run.metrics["step"].dropna() if "step" in run.metrics else []
    last = int(steps.max()) if len(steps) else 0
    log_every = (run.config.get("train") or {}).get("log_every") or 1
    if last + max(1, int(log_every)) <= run.max_steps:
        return f"logged up to step {last} of train.max_steps {run.max_steps}: still training, or stopped"
    return None


def load_complete_runs(runs_dir: Path) -> tuple[list[RunData], dict[str, str]]:
    """(the complete runs of `runs_dir`, {left-out run: why}): a report or verdict reads only the
    first and names the second."""
    runs, left_out = [], {}
    for run in (load_run(p) for p in run_folders(runs_dir)):
        reason = incomplete_reason(run)
        if reason is None:
            runs.append(run)
        else:
            left_out[run.name] = reason
    return runs, left_out


def left_out_sentence(left_out: dict[str, str]) -> str | None:
    """One sentence naming the runs a report left out, and why (None when none was)."""
    if not left_out:
        return None
    return "Left out (not complete): " + "; ".join(f"`{n}` ({why})" for n, why in sorted(left_out.items())) + "."


def load_runs(runs_dir: Path) -> list[RunData]:
    """The complete run folders of `runs_dir` (`load_complete_runs`)."""
    return load_complete_runs(runs_dir)[0]


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ReportInputError(f"{path}:{exc.lineno}: invalid JSON: {exc.msg}") from exc


def read_json_file(path: Path | None) -> Any:
    """A JSON file's content, None when not given or absent (an optional input)."""
    if path is None or not path.is_file():
        return None
    return _read_json(path)


def load_bench(path: Path | None) -> dict | None:
    if path is None or not path.is_file():
        return None
    data = _read_json(path)
    if not isinstance(data, dict) or "balancers" not in data:
        raise ReportInputError(f"{path}: expected a `balancers` mapping (from `marble bench step`)")
    return data


def load_eval_summary(path: Path | None) -> pd.DataFrame | None:
    """The long eval summary (run, checkpoint, dataset, metric, value)."""
    if path is None or not path.is_file():
        return None
    frame = pd.read_csv(path)
    missing = {"run", "checkpoint", "dataset", "metric", "value"} - set(frame.columns)
    if missing:
        raise ReportInputError(f"{path}: missing columns {sorted(missing)}")
    values = pd.to_numeric(frame["value"], errors="coerce")
    bad = frame.index[frame["value"].notna() & values.isna()]
    if len(bad):  # text where a number goes was a silent NaN: a score missing from the tables
        row = bad[0]
        raise ReportInputError(f"{path}:{row + 2}: `value` = {frame['value'][row]!r} "
                               "is not a number (rebuild it with the eval_summary rule)")
    frame["value"] = values
    frame["checkpoint"] = frame["checkpoint"].astype(str)
    return frame


def natural_key(text: str) -> list:
    """'checkpoint-000020' after 'checkpoint-5'; 'final' sorts after numbered names."""
    parts = re.split(r"(\d+)", str(text))
    return [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in parts if p]


def latest_checkpoint_name(names: list[str]) -> str:
    return sorted(names, key=natural_key)[-1]


@dataclass
class ScoredImage:
    """One evaluated image of a run for the report's grid: its file, prompt and finite scores
    (what `marble evaluate` wrote; its inputs are `marble.evaluation.prompts.EvalSample`)."""

    image_path: Path
    prompt: str
    scores: dict[str, float]


def eval_samples(eval_dir: Path, run: str, limit: int) -> dict[str, list[ScoredImage]]:
    """First `limit` images per dataset of the run's latest evaluated checkpoint."""
    run_dir = eval_dir / run
    if not run_dir.is_dir():
        return {}
    ckpts = [p.name for p in run_dir.iterdir() if p.is_dir()]
    if not ckpts:
        return {}
    ckpt_dir = run_dir / latest_checkpoint_name(ckpts)
    out: dict[str, list[ScoredImage]] = {}
    for ds_dir in sorted(p for p in ckpt_dir.iterdir() if p.is_dir()):
        samples = _dataset_samples(ds_dir, limit)
        if samples:
            out[ds_dir.name] = samples
    return out


def _dataset_samples(ds_dir: Path, limit: int) -> list[ScoredImage]:
    by_image: dict[str, tuple[str, dict]] = {}
    results = ds_dir / "evaluation_results.jsonl"
    if results.is_file():
        for lineno, rec in read_jsonl(results, ReportInputError):
            if not isinstance(rec, dict):
                raise ReportInputError(f"{results}:{lineno}: expected a JSON object")
            check_result_row(rec, f"{results}:{lineno}", ReportInputError)  # the evaluation's row types
            name = Path(str(rec.get("image_path") or "")).name
            by_image[name] = (str(rec.get("prompt", "")), _finite_scores(rec.get("scores")))
    # `marble evaluate --image_format`: .jpg (the reference's layout, default) or .png.
    images = sorted((p for p in (ds_dir / "images").glob("*") if p.suffix in IMAGE_SUFFIXES),
                    key=lambda p: natural_key(p.name))
    samples = []
    for img in images[:limit]:
        prompt, scores = by_image.get(img.name, ("", {}))
        samples.append(ScoredImage(img, prompt, scores))
    return samples


def _finite_scores(scores: Any) -> dict[str, float]:
    if not isinstance(scores, dict):
        return {}
    out = {}
    for key, value in scores.items():
        if isinstance(value, (int, float)) and math.isfinite(value):
            out[str(key)] = float(value)
    return out
