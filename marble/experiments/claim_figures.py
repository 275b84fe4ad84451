"""The claim section's three figures: change per reward, anti-aligned fraction against N
(with the paper's 80% / 0% drawn beside it), and each arm's cost."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from marble.runtime.io import atomic_path  # noqa: E402


def _save(fig, path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return f"figures/{path.name}"


def _err(d: dict) -> tuple[float, float, float]:
    """(mean, lower error, upper error), NaN where absent."""
    if not d or d.get("mean") is None:
        return np.nan, 0.0, 0.0
    if d.get("low") is None:
        return d["mean"], 0.0, 0.0
    return d["mean"], d["mean"] - d["low"], d["high"] - d["mean"]


def change_figure(v: dict, path: Path) -> str:
    """One panel per reward, each on its own scale (a specialist moves by a tenth of what a
    generalist does): every arm's change with its interval, the baseline arm's mean and the
    reward's change trained alone drawn across."""
    rewards, arms = v["rewards"], v["arms"]
    alone = (v.get("questions", {}).get("every_reward_learnable_alone") or {}).get("per_reward", {})
    cols = min(len(rewards), 2)
    rows = -(-len(rewards) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(max(6, 0.55 * len(arms)) * cols, 2.8 * rows),
                             squeeze=False)
    x = np.arange(len(arms))
    for ax, r in zip(axes.flat, rewards):
        vals = [_err(v["arm_results"][a]["change"].get(r)) for a in arms]
        colors = ["tab:red" if a == v["marble_arm"] else "tab:grey" if a == v["baseline_arm"]
                  else "tab:blue" for a in arms]
        ax.bar(x, [m for m, _, _ in vals], 0.7, color=colors,
               yerr=np.array([[lo for _, lo, _ in vals], [hi for _, _, hi in vals]]), capsize=2)
        base = _err(v["arm_results"][v["baseline_arm"]]["change"].get(r))[0]
        ax.axhline(base, color="tab:grey", ls="--", lw=1, label=f"{v['baseline_arm']} (mean)")
        own = (alone.get(r) or {}).get("change", {}).get("mean")
        if own is not None:
            ax.axhline(own, color="tab:green", ls=":", lw=1.2, label="trained alone (mean)")
        ax.axhline(0, color="black", lw=0.8)
        ax.set_xticks(x, arms, rotation=35, ha="right", fontsize=7)
        ax.set_title(r + (" (specialist)" if r in v["specialists"] else ""), fontsize=9)
        ax.legend(fontsize=6, loc="lower right")
    for ax in list(axes.flat)[len(rewards):]:
        ax.axis("off")
    fig.suptitle(f"Change from the initial model, 95% interval over seeds "
                 f"(red: {v['marble_arm']}, grey: {v['baseline_arm']})", fontsize=10)
    fig.tight_layout()
    return _save(fig, path)


def n_curve_arms(v: dict) -> list[str]:
    """The N curve's arms, by N: those that differ from the MARBLE arm in N alone. Not the
    sweep's micro-batch sizes, other alpha EMAs, the output-space Gram or the norm-corrected
    step: they would stack unlabelled points at one N."""
    settings = v["arm_settings"]
    ref = {k: x for k, x in settings.get(v["marble_arm"], {}).items() if k != "amortize_every"}
    arms = [a for a in v["arms"] if settings.get(a, {}).get("method") == "marble"
            and {k: x for k, x in settings[a].items() if k != "amortize_every"} == ref]
    return sorted(arms, key=lambda a: settings[a]["amortize_every"])


def anti_figure(v: dict, path: Path) -> str:
    fig, ax = plt.subplots(figsize=(6, 3.5))
    settings = v["arm_settings"]
    marble = n_curve_arms(v)
    for key, label in (("applied", "applied direction"), ("fresh_solve", "fresh solve, same gradients")):
        vals = [_err(v["arm_results"][a]["anti_aligned"][key]) for a in marble]
        ax.errorbar([settings[a]["amortize_every"] for a in marble], [m for m, _, _ in vals],
                    yerr=np.array([[lo for _, lo, _ in vals], [hi for _, _, hi in vals]]),
                    marker="o", capsize=3, label=f"MARBLE, {label}")
    for arm, style in ((v["baseline_arm"], "--"),):
        m, lo, hi = _err(v["arm_results"][arm]["anti_aligned"]["applied"])
        ax.axhspan(m - lo, m + hi, color="grey", alpha=0.2)
        ax.axhline(m, color="grey", ls=style, label=f"{arm} (ours)")
    pub = v["published_anti_aligned"]
    ax.axhline(pub.get("weighted_sum", np.nan), color="red", ls=":", label="weighted sum, published")
    ax.axhline(pub.get("marble", np.nan), color="green", ls=":", label="MARBLE, published")
    ax.set_xscale("log")
    ax.set_xlabel("N (optimizer steps between full solves)")
    ax.set_ylabel("anti-aligned fraction of steps")
    ax.set_ylim(-0.05, 1.05)
    ax.legend(fontsize=7)
    return _save(fig, path)


def cost_figure(v: dict, path: Path) -> str:
    arms = v["arms"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.2))
    ratios = [v["cost"][a].get("flops_ratio") or np.nan for a in arms]
    a1.bar(np.arange(len(arms)), ratios)
    a1.set_ylabel("counted FLOPs vs weighted sum")
    cpu = [_err(v["cost"][a]["cpu_s"]) for a in arms]
    a2.bar(np.arange(len(arms)), [m for m, _, _ in cpu], yerr=np.array([[lo for _, lo, _ in cpu],
                                                        [hi for _, _, hi in cpu]]), capsize=2)
    a2.set_ylabel("CPU seconds per run")
    for ax in (a1, a2):
        ax.set_xticks(np.arange(len(arms)), arms, rotation=35, ha="right", fontsize=7)
    return _save(fig, path)


def write_figures(v: dict, folder: Path) -> dict[str, str]:
    folder.mkdir(parents=True, exist_ok=True)
    return {"change": change_figure(v, folder / "change.png"),
            "anti": anti_figure(v, folder / "anti_aligned_vs_n.png"),
            "cost": cost_figure(v, folder / "cost.png")}
