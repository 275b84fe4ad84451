"""matplotlib figures (Agg backend, PNG). Each function returns the path it wrote, or
None when the inputs hold nothing to plot (the report then says so)."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: no display on cluster nodes or CI
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from PIL import Image  # noqa: E402

from marble.report.loading import ScoredImage, RunData  # noqa: E402
from marble.report.palette import balancer_look, balancer_order, seed_styles  # noqa: E402

DPI = 110


def smooth(values: pd.Series, window: int) -> pd.Series:
    """Trailing moving average that skips NaN (an unscorable epoch is not a zero)."""
    return values.rolling(window, min_periods=1).mean()


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return path


def _panels(n: int, width: float = 4.2, height: float = 3.2, max_cols: int = 3):
    cols = 2 if n == 4 and max_cols >= 2 else min(n, max_cols)  # four panels as 2 x 2, not 3 + 1
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False,
                             layout="constrained")
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


def _seed_label(seed) -> str:
    return "no seed" if seed is None else f"seed {seed}"


def balancer_seed_legend(fig, runs: list[RunData], extra: list | None = None) -> None:
    """One legend for the whole figure, below the panels (never over the data): a colour
    per balancer, a line style per seed, then `extra` (handles for markers and the like)."""
    styles = seed_styles([r.seed for r in runs])
    handles = [Line2D([], [], color=balancer_look(b).color, linewidth=2.5, label=balancer_look(b).label)
               for b in balancer_order(r.balancer for r in runs)]
    if len(styles) > 1:
        handles += [Line2D([], [], color="black", linestyle=ls, linewidth=1.5, label=_seed_label(seed))
                    for seed, ls in styles.items()]
    handles += extra or []
    fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 6), fontsize=9,
               frameon=False)


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
    """One panel per reward, one line per run: faint raw values, bold moving average, the
    colour the balancer's and the line style the seed's (palette); a staged run's stage
    boundaries as dotted lines (a stage logs only its own rewards). One legend below."""
    rewards = sorted({n for r in runs for n in r.reward_names if f"reward/{n}" in r.metrics})
    if not rewards:
        return None
    styles = seed_styles([r.seed for r in runs])
    fig, axes = _panels(len(rewards), width=5.2 if len(rewards) == 4 else 4.2, height=3.2)
    # MARBLE drawn last: on top where two balancers' curves coincide
    order = {b: i for i, b in enumerate(balancer_order(r.balancer for r in runs))}
    for ax, reward in zip(axes, rewards):
        for run in sorted(runs, key=lambda r: order[r.balancer]):
            col = f"reward/{reward}"
            if col not in run.metrics or run.metrics[col].notna().sum() == 0:
                continue
            m, color = run.metrics, balancer_look(run.balancer).color
            ax.plot(m["step"], m[col], color=color, alpha=0.18, linewidth=0.8)
            ax.plot(m["step"], smooth(m[col], window), color=color, linestyle=styles[run.seed], linewidth=2,
                    label=f"_{run.name}")
            _mark_stages(ax, run, color)
            _heldout_curve(ax, run, reward, color)
        ax.set_title(f"reward/{reward}")
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("mean raw reward")
        ax.grid(alpha=0.3)
    held = any(r.evals is not None for r in runs)
    extra = [Line2D([], [], color="black", marker="o", linewidth=0.8, markersize=4,
                    label="held-out evaluation (eval.jsonl)")] if held else []
    balancer_seed_legend(fig, runs, extra)
    fig.suptitle(f"Training rewards (faint: raw; bold: {window}-step moving average)")
    return _save(fig, path)


def _heldout_curve(ax, run: RunData, reward: str, color) -> None:
    """The run's held-out means of the reward (eval.jsonl), markers joined by a thin line:
    the EMA weights on the test prompts with fixed latents, the verdict's change measure."""
    col = f"eval_reward/{reward}"
    if run.evals is None or col not in run.evals:
        return
    points = run.evals[["step", col]].dropna()
    if len(points):
        # "_": named for tests and debugging, never a legend entry (the figure's legend is shared)
        ax.plot(points["step"], points[col], color=color, marker="o", markersize=4, linewidth=0.8,
                label=f"_{run.name} held-out")


def _alpha_kind(run: RunData) -> str:
    """What a run's alpha is, for its panel title: only steps that solved carry a solve."""
    if "full_solve" not in run.metrics:  # not logged (an older run): no claim either way
        return "full solves not logged"
    solves = (run.metrics["full_solve"].fillna(0) > 0).any()
    if not solves:
        return "fixed alpha, never solves"
    every = (run.metrics["full_solve"].dropna() > 0).all()
    return "a full solve every step" if every else "solves every N steps, EMA applied between"


def alpha_trajectories(runs: list[RunData], path: Path) -> Path | None:
    """One panel per run that logged alpha, one colour per reward: the alpha the step
    applied (`alpha/<name>`), a filled marker on the steps that ran a full solve
    (`full_solve` > 0), the EMA cache (`alpha_cache/<name>`) dashed. One legend below."""
    logged = [r for r in runs if any(c.startswith("alpha/") and r.metrics[c].notna().any()
                                     for c in r.metrics.columns)]
    if not logged:
        return None
    names = sorted({c.split("/", 1)[1] for r in logged for c in r.metrics.columns if c.startswith("alpha/")})
    colors = {n: plt.get_cmap("tab10")(i % 10) for i, n in enumerate(names)}
    fig, axes = _panels(len(logged), width=4.4, height=3.0, max_cols=3)
    cached = solved = False
    for ax, run in zip(axes, logged):
        m = run.metrics
        solve_steps = m["full_solve"].fillna(0) > 0 if "full_solve" in m else pd.Series(False, index=m.index)
        for name in names:
            col, cache = f"alpha/{name}", f"alpha_cache/{name}"
            if col not in m:
                continue
            rows = m[["step", col]].assign(solve=solve_steps).dropna(subset=[col])
            ax.plot(rows["step"], rows[col], color=colors[name], linewidth=1.2)
            hits = rows[rows["solve"]]
            ax.plot(hits["step"], hits[col], "o", color=colors[name], markersize=3.5)
            solved |= not hits.empty
            if cache in m and m[cache].notna().any():  # MARBLE: the rho-EMA amortized steps apply
                ema = m[["step", cache]].dropna()
                ax.plot(ema["step"], ema[cache], linestyle="--", color=colors[name], linewidth=1)
                cached = True
        ax.set_title(f"{run.name}: {balancer_look(run.balancer).label}\n({_alpha_kind(run)})", fontsize=9)
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("alpha_k (weight on reward k)")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    handles = [Line2D([], [], color=colors[n], linewidth=2, label=n) for n in names]
    handles.append(Line2D([], [], color="black", linewidth=1.2, label="alpha applied at the step"))
    if solved:
        handles.append(Line2D([], [], color="black", marker="o", linestyle="", label="step with a full solve"))
    if cached:
        handles.append(Line2D([], [], color="black", linestyle="--", label="EMA cache after the step"))
    fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 7), fontsize=9,
               frameon=False)
    fig.suptitle("Reward weights alpha per logged step")
    return _save(fig, path)


def _by_balancer(runs: list[RunData], key: str) -> dict[str, np.ndarray]:
    """balancer -> every finite logged value of `key`, pooled over its runs (seeds)."""
    out: dict[str, list] = {}
    for run in runs:
        if key in run.metrics:
            values = run.metrics[key].to_numpy(dtype=float)
            out.setdefault(run.balancer, []).extend(values[np.isfinite(values)])
    return {b: np.asarray(v) for b, v in out.items() if len(v)}


def cosine_distribution(runs: list[RunData], path: Path) -> Path | None:
    """Per balancer, the distribution of the worst-reward cosine min_k cos(d, g_k) over every
    diagnostic step of its runs (seeds pooled): a box for the applied direction (the
    balancer's colour) beside one for the weighted-sum direction on the same batches
    (hatched); below 0, the step opposed some reward. Raw traces of six runs swinging
    between -1 and 1 read as noise; the summary is what the verdict's (c) asks about."""
    applied, ws = _by_balancer(runs, "cos_min"), _by_balancer(runs, "cos_ws_min")
    balancers = balancer_order(applied)
    if not balancers:
        return None
    fig, ax = plt.subplots(figsize=(max(7.0, 2.8 * len(balancers)), 3.8), layout="constrained")
    for i, bal in enumerate(balancers):
        look = balancer_look(bal)
        for offset, values, hatch in ((-0.2, applied[bal], None), (0.2, ws.get(bal), "///")):
            if values is None or not len(values):
                continue
            box = ax.boxplot([values], positions=[i + offset], widths=0.34, patch_artist=True,
                             showfliers=False, medianprops={"color": "black"})
            box["boxes"][0].set(facecolor=look.color, alpha=0.55 if hatch else 0.85, hatch=hatch)
            jitter = np.random.default_rng(i).uniform(-0.1, 0.1, len(values))
            ax.plot(i + offset + jitter, values, ".", color="black", markersize=2, alpha=0.35)
            below = float(np.mean(values < 0))
            ax.annotate(f"{below:.0%}", (i + offset, -1.12), ha="center", va="center", fontsize=9)
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(balancers)), [balancer_look(b).label for b in balancers])
    ax.set_ylim(-1.24, 1.05)  # room under -1 for the shares, clear of the whiskers
    ax.set_yticks(np.linspace(-1, 1, 9))
    ax.set_ylabel("min_k cos(d, g_k) per diagnostic step")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(handles=[Patch(facecolor="lightgrey", edgecolor="black", label="applied direction d"),
                       Patch(facecolor="lightgrey", edgecolor="black", hatch="///",
                             label="weighted-sum direction, same batches")],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    ax.set_title("Worst-reward cosine per balancer, every diagnostic step of every seed\n"
                 "(box: quartiles; dots: steps; number at the bottom: share of steps below 0)", fontsize=10)
    return _save(fig, path)


def anti_aligned_intervals(applied: dict[str, dict], ws_direction: dict[str, dict],
                           published: dict[str, float], path: Path) -> Path | None:
    """Per balancer, the fraction of diagnostic steps on which the applied direction opposes
    some reward (min_k cos < 0): mean and 95% interval over seeds (verdict.json's
    `anti_aligned_by_balancer`), the weighted-sum direction on the same batches beside it
    (hollow) and the paper's value (black cross) where it published one."""
    balancers = balancer_order(b for b, iv in applied.items() if iv and iv.get("mean") is not None)
    if not balancers:
        return None
    fig, ax = plt.subplots(figsize=(max(7.0, 2.8 * len(balancers)), 3.6), layout="constrained")
    for i, bal in enumerate(balancers):
        color = balancer_look(bal).color
        # applied left (its number on its left), the weighted-sum direction right, the paper's beyond
        for offset, iv, face, side in ((-0.2, applied[bal], color, -1), (0.1, ws_direction.get(bal), "white", 1)):
            if not iv or iv.get("mean") is None:
                continue
            lo, hi = (iv["low"], iv["high"]) if iv.get("low") is not None else (iv["mean"], iv["mean"])
            ax.errorbar([i + offset], [iv["mean"]], yerr=[[iv["mean"] - lo], [hi - iv["mean"]]], fmt="o",
                        color=color, markerfacecolor=face, markersize=8, capsize=5, linewidth=2)
            ax.annotate(f"{iv['mean']:.0%}", (i + offset, iv["mean"]), xytext=(9 * side, 0),
                        textcoords="offset points", va="center", ha="left" if side > 0 else "right", fontsize=9)
        if bal in published:
            ax.plot([i + 0.38], [published[bal]], "x", color="black", markersize=10, markeredgewidth=2)
    ax.set_xticks(range(len(balancers)), [balancer_look(b).label for b in balancers])
    ax.set_xlim(-0.6, len(balancers) - 0.4)
    ax.set_ylim(-0.05, 1.05)
    ax.set_ylabel("fraction of diagnostic steps")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(handles=[Line2D([], [], color="grey", marker="o", linestyle="", markersize=8,
                              label="applied direction, mean [95% interval over seeds]"),
                       Line2D([], [], color="grey", marker="o", markerfacecolor="white", linestyle="",
                              markersize=8, label="weighted-sum direction, same batches"),
                       Line2D([], [], color="black", marker="x", linestyle="", markersize=9,
                              label="published (MARBLE project page)")],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    ax.set_title("Steps with at least one anti-aligned reward (min_k cos < 0)", fontsize=10)
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
    fig, axes = _panels(len(metrics), width=3.6, height=2.9, max_cols=3)
    for ax, metric in zip(axes, metrics):
        sub = cells[cells["metric"] == metric]
        labels = [f"{v:g}" if isinstance(v, float) else textwrap.fill(str(v), 16) for v in sub[key]]
        x = np.arange(len(sub))
        for offset, col, color in ((-0.2, "ours", "tab:blue"), (0.2, "published", "tab:gray")):
            values = sub[col].to_numpy(dtype=float)
            bars = ax.bar(x + offset, np.nan_to_num(values), 0.4, color=color, label=col)
            # A missing value is "–", never a zero-height bar that reads as 0.
            ax.bar_label(bars, labels=["–" if np.isnan(v) else f"{v:.3g}" for v in values],
                         fontsize=8)
        ax.set_xticks(x, labels, fontsize=8.5)
        ax.set_title(textwrap.fill(metric, 36), fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        ax.tick_params(axis="y", labelsize=8.5)
    # one legend below the panels: inside one it sat on that panel's bars
    fig.legend(handles=[Patch(color="tab:blue", label="ours"), Patch(color="tab:gray", label="published")],
               loc="outside lower center", ncols=2, fontsize=9, frameon=False)
    fig.suptitle(title, fontsize=11)
    return _save(fig, path)
