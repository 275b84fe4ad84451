"""matplotlib figures (Agg backend, PNG). Each function returns the path it wrote, or
None when the inputs hold nothing to plot (the report then says so)."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: no display on cluster nodes or CI
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from PIL import Image  # noqa: E402

from marble.config_balancers import BALANCERS  # noqa: E402
from marble.report.loading import ScoredImage, RunData  # noqa: E402

DPI = 110
STYLES = {method: d.style for method, d in BALANCERS.items()}  # each balancer's descriptor


def smooth(values: pd.Series, window: int) -> pd.Series:
    """Trailing moving average that skips NaN (an unscorable epoch is not a zero)."""
    return values.rolling(window, min_periods=1).mean()


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return path


def _panels(n: int, width: float = 4.2, height: float = 3.2, max_cols: int = 3):
    cols = min(n, max_cols)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False,
                             layout="constrained")
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


def _run_colors(runs: list[RunData]) -> dict[str, tuple]:
    cmap = plt.get_cmap("tab10")
    return {r.name: cmap(i % 10) for i, r in enumerate(runs)}


def stage_boundaries(metrics: pd.DataFrame) -> list[tuple[float, str]]:
    """(x, the stage starting there) at each stage change of a staged run's metrics (the
    `stage`, `stage_name` columns marble.training.stages adds), x halfway between the last
    step of one stage and the first of the next; none for a run without stages."""
    if "stage" not in metrics.columns or "step" not in metrics.columns:
        return []
    rows = metrics.dropna(subset=["stage"]).sort_values("step")
    out, prev = [], None
    for step, stage, name in zip(rows["step"], rows["stage"], rows.get("stage_name", rows["stage"])):
        if prev is not None and stage != prev[1]:
            out.append(((prev[0] + step) / 2, str(name)))
        prev = (step, stage)
    return out


def _mark_stages(ax, run: RunData, color) -> None:
    """A staged run's boundaries: a dotted line in the run's colour, the new stage's name."""
    for x, name in stage_boundaries(run.metrics):
        ax.axvline(x, color=color, linestyle=":", linewidth=1)
        ax.annotate(name, (x, 0.98), xycoords=("data", "axes fraction"), rotation=90,
                    fontsize=6, va="top", ha="right", color=color)


def training_curves(runs: list[RunData], path: Path, window: int = 5) -> Path | None:
    """One panel per reward, one line per run: faint raw values, bold moving average; a
    staged run's stage boundaries as dotted lines (a stage logs only its own rewards)."""
    rewards = sorted({n for r in runs for n in r.reward_names if f"reward/{n}" in r.metrics})
    if not rewards:
        return None
    colors = _run_colors(runs)
    fig, axes = _panels(len(rewards))
    for ax, reward in zip(axes, rewards):
        for run in runs:
            col = f"reward/{reward}"
            if col not in run.metrics or run.metrics[col].notna().sum() == 0:
                continue
            m = run.metrics
            style = STYLES.get(run.balancer, "-")
            ax.plot(m["step"], m[col], color=colors[run.name], alpha=0.25, linewidth=1)
            ax.plot(m["step"], smooth(m[col], window), color=colors[run.name], linestyle=style,
                    linewidth=2, label=f"{run.name} ({run.balancer})")
            _mark_stages(ax, run, colors[run.name])
            _heldout_curve(ax, run, reward, colors[run.name])
        ax.set_title(f"reward/{reward}")
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("mean raw reward")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    held = any(r.evals is not None for r in runs)
    fig.suptitle(f"Training rewards (faint: raw; bold: {window}-step moving average"
                 + ("; markers: held-out evaluation, eval.jsonl)" if held else ")"))
    return _save(fig, path)


def _heldout_curve(ax, run: RunData, reward: str, color) -> None:
    """The run's held-out means of the reward (eval.jsonl), markers joined by a thin line:
    the EMA weights on the test prompts with fixed latents, the verdict's change measure."""
    col = f"eval_reward/{reward}"
    if run.evals is None or col not in run.evals:
        return
    points = run.evals[["step", col]].dropna()
    if len(points):
        ax.plot(points["step"], points[col], color=color, marker="o", markersize=4, linewidth=0.8,
                label=f"{run.name} held-out")


def alpha_trajectories(runs: list[RunData], path: Path) -> Path | None:
    """One panel per run that logged alpha, one line per reward."""
    logged = [r for r in runs if any(c.startswith("alpha/") and r.metrics[c].notna().any()
                                     for c in r.metrics.columns)]
    if not logged:
        return None
    fig, axes = _panels(len(logged), width=6.0, max_cols=2)
    for ax, run in zip(axes, logged):
        cmap = plt.get_cmap("tab10")
        for i, col in enumerate(sorted(c for c in run.metrics.columns if c.startswith("alpha/"))):
            name = col.split("/", 1)[1]
            series = run.metrics[["step", col]].dropna()
            ax.plot(series["step"], series[col], marker=".", color=cmap(i % 10), label=f"{name} (solve)")
            cache = f"alpha_cache/{name}"  # MARBLE: the rho-EMA the amortized steps apply
            if cache in run.metrics and run.metrics[cache].notna().any():
                cached = run.metrics[["step", cache]].dropna()
                ax.plot(cached["step"], cached[cache], linestyle="--", color=cmap(i % 10),
                        label=f"{name} (EMA cache)")
        ax.set_title(f"{run.name} ({run.balancer})")
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("alpha_k (weight on reward k)")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # keep lines visible
    fig.suptitle("Reward weights alpha per logged step")
    return _save(fig, path)


def cosine_curves(runs: list[RunData], path: Path) -> Path | None:
    """Worst-reward cosine min_k cos(d, g_k) per logged step: applied direction and the
    weighted-sum direction measured on the same batches."""
    kinds = [("cos_min", "applied direction d"), ("cos_ws_min", "weighted-sum direction (same batches)")]
    if not any(k in r.metrics and r.metrics[k].notna().any() for r in runs for k, _ in kinds):
        return None
    colors = _run_colors(runs)
    fig, axes = _panels(2, width=5.5)
    for ax, (key, title) in zip(axes, kinds):
        for run in runs:
            if key not in run.metrics:
                continue
            series = run.metrics[["step", key]].dropna()
            if series.empty:
                continue
            ax.plot(series["step"], series[key], marker=".", color=colors[run.name],
                    linestyle=STYLES.get(run.balancer, "-"), label=f"{run.name} ({run.balancer})")
        ax.axhline(0.0, color="black", linewidth=0.8)
        ax.set_title(f"min_k cos(d, g_k): {title}")
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("worst-reward cosine")
        ax.set_ylim(-1.05, 1.05)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return _save(fig, path)


def anti_aligned_bars(harmony: pd.DataFrame, path: Path) -> Path | None:
    """Fraction of logged steps with some reward anti-aligned (min_k cos < 0), per run."""
    if harmony.empty or harmony["logged_steps"].sum() == 0:
        return None
    labels = [f"{run}\n({b})" for run, b in zip(harmony.index, harmony["balancer"])]
    x = np.arange(len(labels))
    fig, ax = plt.subplots(figsize=(max(5, 1.6 * len(labels)), 3.6), layout="constrained")
    kinds = ((-0.2, "applied", "applied direction"), (0.2, "ws_dir", "weighted-sum direction"))
    for offset, key, label in kinds:
        bars = ax.bar(x + offset, harmony[f"{key}_anti_aligned_frac"].fillna(0), 0.4, label=label)
        ax.bar_label(bars, fmt="%.2f", fontsize=7)  # a 0 bar is invisible without its number
    ax.set_xticks(x, labels, fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("fraction of logged batches")
    ax.set_title("Batches with at least one anti-aligned reward (min_k cos < 0)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def image_grid(run: str, samples: dict[str, list[ScoredImage]], path: Path) -> Path | None:
    """Rows = eval datasets, columns = the first images, captioned with prompt and scores."""
    if not samples:
        return None
    cols = max(len(v) for v in samples.values())
    fig, axes = plt.subplots(len(samples), cols, figsize=(2.6 * cols, 3.2 * len(samples)),
                             squeeze=False, layout="constrained")
    for row, (dataset, items) in enumerate(samples.items()):
        for col in range(cols):
            ax = axes[row][col]
            ax.axis("off")
            if col >= len(items):
                continue
            item = items[col]
            with Image.open(item.image_path) as img:
                ax.imshow(np.asarray(img.convert("RGB")))
            scores = [f"{k} = {v:.3g}" for k, v in list(item.scores.items())[:2]]
            caption = textwrap.shorten(item.prompt or item.image_path.name, 60, placeholder="...")
            ax.set_title("\n".join(textwrap.wrap(caption, 30)[:2] + scores), fontsize=7)
        axes[row][0].text(-0.08, 0.5, dataset, transform=axes[row][0].transAxes, rotation=90,
                          va="center", ha="right", fontsize=9)
    fig.suptitle(f"Samples: {run}")
    return _save(fig, path)


def ours_vs_published(table: pd.DataFrame, path: Path, title: str) -> Path | None:
    """The headline figure of a paper table: a panel per metric, a pair of bars (ours,
    published) per table row (per rho for the ablation). `table` is a paper_tables frame."""
    key = "rho" if "rho" in table else "row"
    cells = table.groupby([key, "metric"], sort=False).agg(
        ours=("ours", "mean"), published=("published", "mean")).reset_index()
    cells = cells[cells[["ours", "published"]].notna().any(axis=1)]
    if cells.empty:
        return None
    metrics = list(dict.fromkeys(cells["metric"]))
    fig, axes = _panels(len(metrics), width=3.4, height=2.8, max_cols=4)
    for ax, metric in zip(axes, metrics):
        sub = cells[cells["metric"] == metric]
        labels = [f"{v:g}" if isinstance(v, float) else textwrap.fill(str(v), 14) for v in sub[key]]
        x = np.arange(len(sub))
        for offset, col, color in ((-0.2, "ours", "tab:blue"), (0.2, "published", "tab:gray")):
            values = sub[col].to_numpy(dtype=float)
            bars = ax.bar(x + offset, np.nan_to_num(values), 0.4, color=color, label=col)
            # A missing value is "–", never a zero-height bar that reads as 0.
            ax.bar_label(bars, labels=["–" if np.isnan(v) else f"{v:.3g}" for v in values],
                         fontsize=6)
        ax.set_xticks(x, labels, fontsize=7)
        ax.set_title(textwrap.fill(metric, 32), fontsize=8)
        ax.grid(axis="y", alpha=0.3)
        ax.tick_params(axis="y", labelsize=7)
    axes[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    return _save(fig, path)
