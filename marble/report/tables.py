"""The report's tables, as pandas DataFrames (pure functions of the loaded inputs)."""

from __future__ import annotations

import copy
import json
import math
from typing import Callable

import numpy as np
import pandas as pd

from marble.evaluation.summary import composite_zscore
from marble.report.loading import RunData, latest_checkpoint_name
from marble.report.published import COST as PUBLISHED_COST
from marble.report.published import HARMONY as PUBLISHED_HARMONY
from marble.report.verdict import RunTrend

# The MARBLE page's cost table (8xH200, K = 5), relative to the weighted sum: speed as
# published, memory as the published GB over the weighted sum's (67 / 59 = 1.14, to the page's
# two places). One transcription, marble.report.published.COST; this is only its ratio form.
PAPER_COST = {name: (speed, round(gb / PUBLISHED_COST["weighted_sum"][1], 2))
              for name, (speed, gb) in PUBLISHED_COST.items()}
# The page's gradient-harmony numbers (weighted sum -> MARBLE): one transcription.
PAPER_HARMONY = PUBLISHED_HARMONY


def is_count_metric(metric: str) -> bool:
    """average_scores.json's bookkeeping (n_, na_, nan_, failed_ counts, num_samples): not
    scores, so they stay out of the score table and the composite."""
    return metric == "num_samples" or metric.startswith(("n_", "na_", "nan_", "failed_"))


def eval_table(summary: pd.DataFrame, composite: Callable | None = None) -> pd.DataFrame:
    """Table-1 style: one row per run (its latest evaluated checkpoint), one column per
    metric (`dataset/metric` when a metric name occurs in several datasets), composite."""
    summary = summary[~summary["metric"].map(is_count_metric)]
    latest = summary.groupby("run")["checkpoint"].agg(lambda s: latest_checkpoint_name(list(s)))
    rows = summary[summary["checkpoint"] == summary["run"].map(latest)].copy()
    datasets_per_metric = rows.groupby("metric")["dataset"].nunique()
    shared = set(datasets_per_metric[datasets_per_metric > 1].index)
    rows["column"] = [
        f"{d}/{m}" if m in shared else m for d, m in zip(rows["dataset"], rows["metric"])
    ]
    wide = rows.pivot_table(index="run", columns="column", values="value", aggfunc="mean")
    wide = wide.reindex(sorted(wide.columns), axis=1)
    wide.columns.name = None
    table = wide.copy()
    # One definition of the composite for table.md (the eval summary) and the report.
    composite = composite or composite_zscore
    table["composite"] = composite(wide) if len(wide) else np.nan
    table.insert(0, "checkpoint", latest.reindex(table.index))
    return table


def _diag_stats(frame: pd.DataFrame, suffix: str) -> dict[str, float]:
    """Mean worst-reward cosine, mean across-reward variance, anti-aligned fraction."""
    cmin, cvar, anti = f"cos{suffix}_min", f"cos{suffix}_var", f"anti_aligned{suffix}"
    if cmin not in frame:
        return {"steps": 0, "cos_min_mean": math.nan, "cos_var_mean": math.nan, "anti_aligned_frac": math.nan}
    logged = frame[frame[cmin].notna()]
    if anti in logged and logged[anti].notna().all():
        anti_flags = logged[anti].astype(float)
    else:
        anti_flags = (logged[cmin] < 0).astype(float)
    var = logged[cvar].mean() if cvar in logged else math.nan
    return {
        "steps": int(len(logged)),
        "cos_min_mean": float(logged[cmin].mean()) if len(logged) else math.nan,
        "cos_var_mean": float(var) if len(logged) else math.nan,
        "anti_aligned_frac": float(anti_flags.mean()) if len(logged) else math.nan,
    }


def _by_step_kind(frame: pd.DataFrame) -> dict[str, float]:
    """The applied direction's anti-aligned fraction on steps whose diagnostic micro-batch
    was a full solve (a fresh min-norm alpha: d.g_k >= |d|^2, so never anti-aligned up to
    the solver's tolerance) and on amortized steps (the cached EMA alpha, up to
    amortize_every steps old). NaN where a run has no such step or never solves."""
    nan = {"solve_steps": 0, "applied_anti_aligned_frac_solve": math.nan,
           "applied_anti_aligned_frac_amortized": math.nan}
    if "full_solve" not in frame or "cos_min" not in frame:
        return nan
    logged = frame[frame["cos_min"].notna() & frame["full_solve"].notna()]
    solve = logged["full_solve"] > 0
    if not solve.any():  # weighted_sum / equal_alpha: no solve, no split
        return nan
    anti = _diag_stats(logged[solve], "")["anti_aligned_frac"]
    amortized = _diag_stats(logged[~solve], "")["anti_aligned_frac"] if (~solve).any() else math.nan
    return {"solve_steps": int(solve.sum()), "applied_anti_aligned_frac_solve": anti,
            "applied_anti_aligned_frac_amortized": amortized}


def harmony_row(frame: pd.DataFrame) -> dict[str, float]:
    applied, ws = _diag_stats(frame, ""), _diag_stats(frame, "_ws")
    row = {"logged_steps": applied["steps"]}
    row.update({f"applied_{k}": v for k, v in applied.items() if k != "steps"})
    row.update({f"ws_dir_{k}": v for k, v in ws.items() if k != "steps"})
    row.update(_by_step_kind(frame))
    return row


def harmony_by_run(runs: list[RunData]) -> pd.DataFrame:
    rows = [{"run": r.name, "balancer": r.balancer, **harmony_row(r.metrics)} for r in runs]
    return pd.DataFrame(rows).set_index("run") if rows else pd.DataFrame()


def harmony_by_balancer(runs: list[RunData]) -> pd.DataFrame:
    """All logged diagnostic steps of a balancer's runs pooled, with the paper's values."""
    rows = []
    for balancer in sorted({r.balancer for r in runs}):
        pooled = pd.concat([r.metrics for r in runs if r.balancer == balancer], ignore_index=True)
        row = {"balancer": balancer, **harmony_row(pooled)}
        paper = PAPER_HARMONY.get(balancer, {})
        row["published_anti_aligned_frac"] = paper.get("anti_aligned_frac", math.nan)
        row["published_cos_min"] = paper.get("cos_min_mean", math.nan)
        row["published_cos_var"] = paper.get("cos_var_mean", math.nan)
        rows.append(row)
    return pd.DataFrame(rows).set_index("balancer") if rows else pd.DataFrame()


def bench_on_gpu(bench: dict) -> bool:
    """Whether a bench JSON measured GPU memory (a CUDA device); else its `peak_mb` is the
    CPU process's resident set (`memory_kind`: cpu_rss_*), never comparable to GPU GB."""
    return str(bench.get("device", "")).startswith("cuda") or str(bench.get("memory_kind", "")).startswith("cuda")


def cost_table(bench: dict) -> pd.DataFrame:
    """Relative speed = 1 / time ratio and peak-memory ratio, both vs the weighted sum; the
    memory columns name what was measured (GPU memory, or the CPU's RSS on a CPU bench)."""
    mem = "gpu_memory" if bench_on_gpu(bench) else "cpu_rss"
    balancers = bench.get("balancers") or {}
    ratios = bench.get("ratios") or {}
    base = balancers.get("weighted_sum") or {}
    rows = []
    for name, stats in balancers.items():
        ratio = dict(ratios.get(name) or {})
        if name == "weighted_sum":
            ratio = {"time": 1.0, "memory": 1.0}
        time_ratio = ratio.get("time", _safe_div(stats.get("step_s"), base.get("step_s")))
        mem_ratio = ratio.get("memory", _safe_div(stats.get("peak_mb"), base.get("peak_mb")))
        paper_speed, paper_mem = PAPER_COST.get(name, (math.nan, math.nan))
        paper_gb = PUBLISHED_COST.get(name, (math.nan, math.nan))[1]
        rows.append({
            "balancer": name,
            "step_s": _num(stats.get("step_s")),
            f"peak_{mem}_mb": _num(stats.get("peak_mb")),
            "relative_speed": _safe_div(1.0, time_ratio),
            f"{mem}_ratio": _num(mem_ratio),
            "published_relative_speed": paper_speed,
            "published_gpu_memory_ratio": paper_mem,
            "published_peak_gpu_gb": paper_gb,
        })
    return pd.DataFrame(rows).set_index("balancer") if rows else pd.DataFrame()


def _num(x) -> float:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else math.nan


def _safe_div(a, b) -> float:
    a, b = _num(a), _num(b)
    return a / b if math.isfinite(a) and math.isfinite(b) and b != 0 else math.nan


# Balancer keys the ablation table varies: rho, and our exact-masking option (the
# `rho_07_exact` preset), so one table shows rho_05 / rho_07 / rho_07_exact / rho_09.
ABLATION_KEYS = ("alpha_ema", "exact_masking")


def exact_masking(run: RunData) -> bool | None:
    """The run's `balancer.exact_masking` (None for configs written before the key)."""
    value = (run.config.get("balancer") or {}).get("exact_masking")
    return None if value is None else bool(value)


def rho_groups(runs: list[RunData]) -> list[list[RunData]]:
    """Groups of >= 2 MARBLE runs whose configs differ only in `balancer.alpha_ema` and
    `balancer.exact_masking`, sorted by rho, the reference's masking first."""
    groups: dict[str, list[RunData]] = {}
    for run in runs:
        if run.balancer != "marble" or run.alpha_ema is None or not run.config:
            continue
        rest = copy.deepcopy(run.config)
        rest.pop("preset", None)  # a preset name is a label, not a setting
        for key in ABLATION_KEYS:
            rest.get("balancer", {}).pop(key, None)
        key = json.dumps(rest, sort_keys=True, default=str)
        groups.setdefault(key, []).append(run)
    out = []
    for members in groups.values():
        if len({(r.alpha_ema, exact_masking(r)) for r in members}) >= 2:
            out.append(sorted(members, key=lambda r: (r.alpha_ema, bool(exact_masking(r)),
                                                      r.name)))
    return out


def rho_table(group: list[RunData], trends: dict[str, RunTrend], evals: pd.DataFrame | None) -> pd.DataFrame:
    """rho, [exact_masking when the group varies it,] run, then eval scores when the runs
    were evaluated, else last training rewards."""
    varies_masking = len({exact_masking(r) for r in group}) > 1
    rows = []
    for run in group:
        row = {"rho": run.alpha_ema}
        if varies_masking:
            row["exact_masking"] = exact_masking(run)
        row["run"] = run.name
        if evals is not None and run.name in evals.index:
            row.update(evals.loc[run.name].drop("checkpoint", errors="ignore").to_dict())
        else:
            row.update({f"train/{c.reward}": c.last for c in trends[run.name].changes.values()})
        rows.append(row)
    return pd.DataFrame(rows).set_index("rho")


def training_change_table(trends: list[RunTrend]) -> pd.DataFrame:
    """Per run and reward: mean of the first and last logged epochs and the change."""
    rows = []
    for t in trends:
        for c in t.changes.values():
            rows.append({
                "run": t.run, "balancer": t.balancer, "reward": c.reward,
                "first": c.first, "last": c.last, "change": c.delta, "improved": c.improved,
            })
    return pd.DataFrame(rows)
