"""The report's first screen: the verdict's three answers in one line each and one figure
that draws every number they rest on with its 95% interval, then what was run.

The figure reads verdict.json's data (marble.report.demo_claim.demo_verdict): (a) MARBLE's
change per reward, (b) MARBLE minus the weighted sum per specialist, paired by seed, (c)
the anti-aligned fraction of both and their paired difference, the paper's values beside.
A point without an interval is a single seed; an answer the runs cannot give says why."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: no display on cluster nodes or CI
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from marble.report.demo_claim import BASELINE, MARBLE, Q_A, Q_B, Q_C  # noqa: E402
from marble.report.loading import RunData  # noqa: E402
from marble.report.palette import balancer_look, balancer_order  # noqa: E402
from marble.report.render import Figure, Table, Text  # noqa: E402

DPI = 110
SHORT = {Q_A: "(a) every reward rises under MARBLE",
         Q_B: "(b) every specialist rises more under MARBLE than under the weighted sum",
         Q_C: "(c) MARBLE's direction opposes a reward on fewer steps than the weighted sum's"}


def answer_word(answer) -> tuple[str, str]:
    """(the answer in a word or a bound, its colour): yes / no / undecided."""
    if answer is True:
        return "yes", "tab:green"
    if answer is False:
        return "no", "tab:red"
    bound = str(answer).rsplit(" ", 1)[-1]
    if bound in ("inf", "infinity"):
        return "not answered (too few runs or seeds)", "tab:gray"
    return f"undecided: {answer}", "tab:orange"


def summary_line(data: dict) -> str:
    """The verdict in one line: each question's short form and its answer."""
    return "; ".join(f"{SHORT[q]}: {answer_word(data['questions'][q]['answer'])[0]}"
                     for q in (Q_A, Q_B, Q_C) if q in data.get("questions", {}))


def _rows(ax, rows: list[tuple[str, dict | None, str]], published: dict[str, float]) -> None:
    """Horizontal interval rows: (label, interval JSON, colour); a label in `published`
    gets the paper's value as a black cross."""
    for y, (label, iv, color) in enumerate(rows):
        if not iv or iv.get("mean") is None:
            ax.annotate("n/a", (0, y), ha="center", va="center", fontsize=8, color="grey")
            continue
        mean = iv["mean"]
        lo, hi = (iv["low"], iv["high"]) if iv.get("low") is not None else (mean, mean)
        ax.errorbar([mean], [y], xerr=[[mean - lo], [hi - mean]], fmt="o", color=color, capsize=4,
                    linewidth=2, markersize=6)
        single = "" if iv.get("low") is not None else " (1 seed)"
        ax.annotate(f"{mean:+.3g}{single}", (mean, y), xytext=(0, 7), textcoords="offset points",
                    ha="center", fontsize=9)
        if label in published:
            ax.plot([published[label]], [y], "x", color="black", markersize=8, markeredgewidth=2)
    labels = [textwrap.fill(label, 18, break_long_words=False) for label, _, _ in rows]
    ax.set_yticks(range(len(rows)), labels, fontsize=9.5)
    ax.set_ylim(len(rows) - 0.4, -0.6)  # first row on top
    ax.axvline(0, color="black", linewidth=0.8)
    ax.grid(axis="x", alpha=0.3)
    ax.tick_params(axis="x", labelsize=9)


def _title(ax, question: str, answer) -> None:
    """The question (wrapped) in black, the answer under it in its colour and bold: the
    title keeps an empty last line that the answer fills."""
    word, color = answer_word(answer)
    ax.set_title(textwrap.fill(SHORT[question], 48) + "\n", fontsize=10, loc="left")
    ax.annotate(word, (0, 1), xycoords="axes fraction", xytext=(0, 5), textcoords="offset points",
                color=color, fontsize=10, fontweight="bold", va="bottom", ha="left")


def glance_figure(data: dict, path: Path) -> Path | None:
    """Three panels, one per question, every number with its 95% interval over seeds."""
    questions = data.get("questions") or {}
    if not all(q in questions for q in (Q_A, Q_B, Q_C)):
        return None
    qa, qb, qc = questions[Q_A], questions[Q_B], questions[Q_C]
    anti = data.get("anti_aligned_by_balancer") or {}
    specialists = [p["difference"] for p in (qb.get("per_specialist") or {}).values()]
    drawable = [*(qa.get("change") or {}).values(), *specialists, anti.get(BASELINE), anti.get(MARBLE),
                qc.get("difference")]
    if not any(iv and iv.get("mean") is not None for iv in drawable):
        return None  # no question had the runs it needs: the answers say so, a figure of "n/a" would not
    marble_color, ws_color = balancer_look(MARBLE).color, balancer_look(BASELINE).color
    fig, axes = plt.subplots(1, 3, figsize=(13.0, 3.0), layout="constrained")
    _rows(axes[0], [(r, iv, marble_color) for r, iv in (qa.get("change") or {}).items()], {})
    axes[0].set_xlabel(f"change of the reward under MARBLE ({qa.get('measure', 'n/a')})", fontsize=9)
    _rows(axes[1], [(s, p["difference"], marble_color) for s, p in (qb.get("per_specialist") or {}).items()], {})
    axes[1].set_xlabel(f"MARBLE minus weighted sum, paired by seed ({qb.get('measure', 'n/a')})", fontsize=9)
    published = data.get("anti_aligned_published") or {}
    labels = {BASELINE: balancer_look(BASELINE).label, MARBLE: balancer_look(MARBLE).label}
    _rows(axes[2], [(labels[BASELINE], anti.get(BASELINE), ws_color), (labels[MARBLE], anti.get(MARBLE), marble_color),
                    ("weighted sum minus MARBLE", qc.get("difference"), "black")],
          {labels[b]: published[b] for b in (BASELINE, MARBLE) if b in published})
    axes[2].set_xlabel("fraction of diagnostic steps anti-aligned (x: published)", fontsize=9)
    for ax, q in zip(axes, (Q_A, Q_B, Q_C)):
        _title(ax, q, questions[q]["answer"])
    fig.suptitle("The verdict: mean and 95% interval over seeds (a dot alone: one seed)", fontsize=10, x=0.0,
                 ha="left")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return path


def verdict_blocks(data: dict, root: Path) -> list:
    """The answers one line each, then the figure that draws them (the detailed sentences
    follow in the caller's section)."""
    questions = data.get("questions") or {}
    blocks: list = [Text(f"{SHORT[q]}: {answer_word(questions[q]['answer'])[0]}.")
                    for q in (Q_A, Q_B, Q_C) if q in questions]
    written = glance_figure(data, root / "figures" / "verdict.png")
    if written is not None:
        blocks.append(Figure("The verdict's numbers: each answer's measure with its 95% Student-t interval "
                             "over seeds (details below)", written.relative_to(root)))
    return blocks


def _steps(run: RunData) -> str:
    done = run.metrics["step"].max() if "step" in run.metrics and len(run.metrics) else math.nan
    return "n/a" if not math.isfinite(done) else str(int(done))


def what_was_run(runs: list[RunData]) -> list:
    """One row per balancer: its runs, seeds, logged steps, rewards and base model."""
    rows = []
    for bal in balancer_order(r.balancer for r in runs):
        mine = [r for r in runs if r.balancer == bal]
        models = {str((r.config.get("model") or {}).get("path", "?")) for r in mine}
        rows.append({"balancer": balancer_look(bal).label, "runs": ", ".join(r.name for r in mine),
                     "seeds": ", ".join(str(r.seed) for r in mine if r.seed is not None) or "none",
                     "optimizer steps": ", ".join(sorted({_steps(r) for r in mine})),
                     "rewards": ", ".join(dict.fromkeys(n for r in mine for n in r.reward_names)),
                     "base model": ", ".join(sorted(Path(m).name or m for m in models))})
    if not rows:
        return [Text("No run folder: nothing was run.")]
    return [Table("The runs the verdict reads, per balancer (each run's config.yaml)",
                  pd.DataFrame(rows).set_index("balancer"))]
