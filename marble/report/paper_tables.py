"""The paper's other tables (rho ablation, gradient harmony, training cost), ours beside the
published numbers: pure functions of loaded runs, the eval summary and the bench JSONs.

Every builder returns a *long* frame, one row per (table row, metric), with the columns
`ours`, `published`, `basis` (how ours was measured; one protocol per table) and `source`
(where the published number comes from). Long frames stay narrow (they fit any screen and
diff well in DVC); `wide_markdown` pivots one for reading, each cell "ours / published".
"""

from __future__ import annotations

import math

import pandas as pd

from marble.report import published
from marble.report import table1 as table1_builder
from marble.report.loading import RunData, latest_checkpoint_name
from marble.report.render import markdown_table
from marble.report.tables import (
    bench_on_gpu,
    exact_masking,
    harmony_row,
    rho_groups,
)
from marble.report.verdict import reward_changes

COLUMNS = ["row", "metric", "ours", "published", "basis", "source"]
NOT_MEASURED = "not measured"


def _frame(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=COLUMNS)


# ------------------------------------------------------------------ rho ablation


def _rho_runs(runs: list[RunData]) -> list[RunData]:
    """The largest group of MARBLE runs that differ only in rho (and exact masking)."""
    groups = rho_groups(runs)
    return max(groups, key=len) if groups else []


def _eval_values(long_eval: pd.DataFrame | None, run: str) -> dict[str, float]:
    """Our values at the run's latest evaluated checkpoint: marble.report.table1.run_values
    (the paper's columns and scales; a toy reward as its mean over the eval datasets)."""
    if long_eval is None or run not in set(long_eval["run"]):
        return {}
    mine = long_eval[long_eval["run"] == run]
    latest = latest_checkpoint_name(list(mine["checkpoint"]))
    return table1_builder.run_values(mine[mine["checkpoint"] == latest])


def _train_values(run: RunData) -> dict[str, float]:
    """Each reward's mean over the last logged epochs of training (the verdict's window)."""
    return {f"train {c.reward}": c.last
            for c in reward_changes(run.metrics, run.reward_names).values()}


def _rho_label(run: RunData, varies_masking: bool) -> str:
    """`ours: <run>`, marked when the group mixes masking modes (rho_07 vs rho_07_exact)."""
    masking = " (exact masking)" if varies_masking and exact_masking(run) else ""
    return f"ours: {run.name}{masking}"


def rho_ablation(runs: list[RunData], long_eval: pd.DataFrame | None) -> pd.DataFrame:
    """One row per (rho, source, metric): the published ablation and our runs that differ
    only in `balancer.alpha_ema`. Ours are eval scores when every run was evaluated, else
    (the same protocol for every row) the last training rewards, named `train <reward>`."""
    group = _rho_runs(runs)
    evaluated = bool(group) and all(_eval_values(long_eval, r.name) for r in group)
    basis = "eval: latest checkpoint" if evaluated else "training reward: last logged epochs"
    varies_masking = len({exact_masking(r) for r in group}) > 1
    rows = []
    for rho, values in published.RHO_ABLATION.items():
        for metric, value in zip(published.RHO_COLUMNS, values):
            rows.append({"rho": rho, "row": "published", "metric": metric, "ours": math.nan,
                         "published": value, "basis": "", "source": published.RHO_SOURCE})
    for run in group:
        ours = _eval_values(long_eval, run.name) if evaluated else _train_values(run)
        paper = dict(zip(published.RHO_COLUMNS, published.RHO_ABLATION.get(run.alpha_ema, [])))
        for metric, value in ours.items():
            rows.append({"rho": run.alpha_ema, "row": _rho_label(run, varies_masking), "metric": metric,
                         "ours": value, "published": paper.get(metric, math.nan),
                         "basis": basis, "source": published.RHO_SOURCE if metric in paper else ""})
    frame = pd.DataFrame(rows, columns=["rho", *COLUMNS])
    return frame.sort_values(["rho", "row"], kind="stable").reset_index(drop=True)


# ------------------------------------------------------------------ gradient harmony

HARMONY_METRICS = {
    "anti_aligned_frac": "mini-batches with an anti-aligned reward",
    "cos_min_mean": "worst-reward cosine min_k cos(d, g_k)",
    "cos_var_mean": "across-reward variance var_k cos(d, g_k)",
}


def harmony(runs: list[RunData]) -> pd.DataFrame:
    """Per balancer (its runs' logged diagnostic steps pooled; `applied` direction) the three
    harmony numbers beside the page's weighted sum -> MARBLE values."""
    rows = []
    for balancer in sorted({r.balancer for r in runs}):
        mine = [r for r in runs if r.balancer == balancer]
        stats = harmony_row(pd.concat([r.metrics for r in mine], ignore_index=True))
        steps = stats["logged_steps"]
        basis = (f"{len(mine)} run(s), {steps} logged diagnostic steps" if steps
                 else f"{NOT_MEASURED}: no `cos_min` logged (balancer.diagnostics_every)")
        paper = published.HARMONY.get(balancer, {})
        for key, label in HARMONY_METRICS.items():
            rows.append({"row": balancer, "metric": label, "ours": stats[f"applied_{key}"],
                         "published": paper.get(key, math.nan), "basis": basis,
                         "source": published.HARMONY_SOURCE if paper else ""})
    return _frame(rows)


# ------------------------------------------------------------------ training cost

# The page's rows and ours: (published COST key, our bench row, its marble_run mode).
COST_ROWS = {
    "Weighted sum (DiffusionNFT)": ("weighted_sum", "weighted_sum", None),
    "MARBLE without amortization": ("mgda", "mgda", None),
    "MARBLE with amortization, N = 10": ("marble", "marble", "retain"),
}
SPEED, MEMORY = "relative speed (x)", "peak GPU memory (GB)"
# A CPU bench measures the process's resident set (bench JSON `memory_kind`: cpu_rss_*), not
# GPU memory: its own metric, so no table cell or figure panel sets it beside the paper's GB.
CPU_MEMORY = "peak CPU memory, RSS (GB)"


def memory_metric(bench: dict) -> str:
    """The name of a bench's memory measure: GPU memory on a CUDA device, else the CPU RSS."""
    return MEMORY if bench_on_gpu(bench) else CPU_MEMORY


def _bench_row(bench: dict, row: str, run_mode: str | None) -> tuple[float, float]:
    """(relative speed, peak GB) of a bench row; MARBLE with amortization is the bench's
    `marble_run` estimate (M - 1 amortized micro-steps and one full solve) when present."""
    run = (bench.get("marble_run") or {}).get(run_mode or "") or {}
    stats = run or (bench.get("balancers") or {}).get(row) or {}
    ratio = 1.0 if row == "weighted_sum" else (run.get("time") if run else
                                               ((bench.get("ratios") or {}).get(row) or {}).get("time"))
    speed = 1.0 / ratio if isinstance(ratio, (int, float)) and ratio > 0 else math.nan
    peak = stats.get("peak_mb")
    return speed, (peak / 1024 if isinstance(peak, (int, float)) else math.nan)


def _bench_basis(bench: dict) -> str:
    device = str(bench.get("device", "?"))
    where = bench.get("gpu") or device
    toy = "" if device.startswith("cuda") else ", a toy analogue (not the paper's scale)"
    return f"measured: `marble bench step` preset {bench.get('preset', '?')} on {where}{toy}"


def _flops_rows(flops: dict) -> dict[str, dict]:
    """{balancer: row} from `marble bench flops` JSON: a `balancers` mapping or a `rows` list."""
    found = flops.get("balancers") or flops.get("rows") or {}
    if isinstance(found, list):
        found = {str(r.get("balancer") or r.get("name")): r for r in found if isinstance(r, dict)}
    return found if isinstance(found, dict) else {}


def _flops_value(row: dict, word: str) -> float:
    """The first numeric field whose name holds `word` (e.g. `flops`, `peak`)."""
    for key, value in row.items():
        if word in key and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return math.nan


def cost(bench: dict | None, flops: dict | None) -> pd.DataFrame:
    """The page's cost table beside ours: a timed bench when one ran on a GPU, else counted
    FLOPs and live-tensor peaks (ratios to the weighted sum, labelled as counts, not
    timings), else "not measured". A CPU bench (tiny) is shown, labelled as a toy."""
    gpu_bench = bench is not None and str(bench.get("device", "")).startswith("cuda")
    counted = _flops_rows(flops) if flops else {}
    rows = []
    for label, (paper_key, bench_row, run_mode) in COST_ROWS.items():
        paper_speed, paper_gb = published.COST[paper_key]
        if bench is not None and (gpu_bench or not counted):
            speed, peak_gb = _bench_row(bench, bench_row, run_mode)
            ours = {SPEED: speed, memory_metric(bench): peak_gb}
            basis = _bench_basis(bench)
        elif counted and bench_row in counted and "weighted_sum" in counted:
            base, mine = counted["weighted_sum"], counted[bench_row]
            speed = _flops_value(base, "flops") / _flops_value(mine, "flops")
            mem = _flops_value(mine, "peak") / _flops_value(base, "peak")
            # The page's memory column is absolute GB: ours is a ratio, so it says so.
            ours = {"counted FLOP ratio (weighted sum / this)": speed,
                    "counted live-peak ratio (this / weighted sum)": mem}
            basis = "counted: `marble bench flops` (operation counts, not a timing)"
        else:
            ours, basis = {SPEED: math.nan, MEMORY: math.nan}, NOT_MEASURED
        published_by_metric = {SPEED: paper_speed, MEMORY: paper_gb}
        for metric, value in ours.items():
            rows.append({"row": label, "metric": metric, "ours": value,
                         "published": published_by_metric.get(metric, math.nan),
                         "basis": basis, "source": published.COST_SOURCE})
        for metric, value in published_by_metric.items():
            if metric not in ours:  # the page's absolute numbers stay visible
                rows.append({"row": label, "metric": metric, "ours": math.nan, "published": value,
                             "basis": basis, "source": published.COST_SOURCE})
    return _frame(rows)


# ------------------------------------------------------------------ rendering


def _one(value) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.4g}"


def metric_order(frame: pd.DataFrame) -> list[str]:
    """The metrics with a published value first (the paper's order), then ours alone."""
    metrics = list(dict.fromkeys(frame["metric"]))
    paper = set(frame.loc[frame["published"].notna(), "metric"])
    return [m for m in metrics if m in paper] + [m for m in metrics if m not in paper]


def compact(frame: pd.DataFrame) -> pd.DataFrame:
    """A row per table row, a column per metric, each cell "ours / published"."""
    keys = ["rho", "row"] if "rho" in frame else ["row"]
    metrics = metric_order(frame)
    rows = []
    for key, group in frame.groupby(keys, sort=False):
        key = key if isinstance(key, tuple) else (key,)
        cells = {m: f"{_one(o)} / {_one(p)}"
                 for m, o, p in zip(group["metric"], group["ours"], group["published"])}
        rows.append({**dict(zip(keys, key)), **{m: cells.get(m, "–") for m in metrics}})
    return pd.DataFrame(rows).set_index(keys)


def has_overlap(frame: pd.DataFrame) -> bool:
    """Whether any metric has both our value and a published one (else "ours / published"
    cells would each hold one side only: the tiny default against the paper's metrics)."""
    return bool((frame["ours"].notna() & frame["published"].notna()).any()) if len(frame) else False


def one_side(frame: pd.DataFrame, column: str) -> pd.DataFrame:
    """A row per table row, a column per metric that has a `column` value, that value."""
    keys = ["rho", "row"] if "rho" in frame else ["row"]
    kept = frame[frame[column].notna()]
    if kept.empty:
        return pd.DataFrame()
    metrics = list(dict.fromkeys(kept["metric"]))
    rows = []
    for key, group in kept.groupby(keys, sort=False):
        key = key if isinstance(key, tuple) else (key,)
        cells = dict(zip(group["metric"], group[column]))
        rows.append({**dict(zip(keys, key)), **{m: _one(cells.get(m)) for m in metrics}})
    return pd.DataFrame(rows).set_index(keys)


def wide_markdown(frame: pd.DataFrame, title: str) -> str:
    """The compact table, then the bases and sources as lines (each said once)."""
    lines = [f"## {title}", "", "Each cell: ours / published (– = none).", ""]
    lines += [markdown_table(compact(frame)) if not frame.empty else "(no rows)", ""]
    for name, values in (("basis of ours", frame["basis"]), ("source", frame["source"])):
        for value in dict.fromkeys(v for v in values if v):
            lines.append(f"- {name}: {value}")
    return "\n".join(lines) + "\n"


def metrics_json(frame: pd.DataFrame) -> dict:
    """DVC metrics: {row: {metric: ours}} (NaN -> null), published rows left out."""
    keys = ["rho", "row"] if "rho" in frame else ["row"]
    out: dict = {}
    for _, rec in frame[frame["row"] != "published"].iterrows():
        name = " ".join(f"rho={rec[k]:g}" if k == "rho" else str(rec[k]) for k in keys)
        value = rec["ours"]
        out.setdefault(name, {})[rec["metric"]] = None if pd.isna(value) else float(value)
    return out



# ------------------------------------------------------------------ Table 1 (the report's view)


def table1(runs: list[RunData], long_eval: pd.DataFrame | None) -> pd.DataFrame:
    """Per balancer with a published row (weighted sum, MARBLE): our values (mean over its
    runs, i.e. seeds, at their latest checkpoints) beside the published row, built by THE
    Table 1 builder (marble.report.table1.build; composites over these rows). The full Table 1
    with every published row is the Table 1 target's (results/eval/table1.*)."""
    ours, rows, basis = {}, {}, {}
    for balancer, paper_row in published.BALANCER_ROWS.items():
        mine = [v for v in (_eval_values(long_eval, r.name) for r in runs if r.balancer == balancer) if v]
        keys = dict.fromkeys(k for m in mine for k in m)
        ours[balancer] = {k: _mean([m[k] for m in mine if k in m]) for k in keys}
        name = f"{balancer} ({paper_row})"
        rows[name] = {"run": balancer, "values": dict(zip(published.TABLE1_COLUMNS[:-1],
                                                          published.TABLE1[paper_row]))}
        basis[name] = (f"eval: latest checkpoint, mean of {len(mine)} run(s)" if mine
                       else f"{NOT_MEASURED}: no evaluated {balancer} run")
    frame = table1_builder.build(ours, {"rows": rows})
    long = table1_builder.long_form(frame, basis, published.SOURCE)
    # A composite over two rows only ranks them (z = +-1 per column): the page's composite is
    # over 11 rows, so this view leaves it out rather than print a number that reads as it.
    return long[long["metric"] != table1_builder.COMPOSITE].reset_index(drop=True)


def _mean(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return sum(finite) / len(finite) if finite else math.nan
