"""Training-reward changes and specialist rewards of run folders (pure functions on
metrics frames, unit-tested).

A reward's training change is the mean of its last `window` logged values minus the mean of
its first `window` (NaN-aware): the report's per-run detail, and the claim's change measure
for runs without a held-out evaluation (marble.report.demo_claim). A specialist is a reward
applicable to a strict subset of the rollouts: its `reward_applicable/<name>` count is below
the largest count of any reward (a general reward applies to every rollout; no total is
logged, so the largest count stands for it). The claim's questions are answered in one
place, marble.report.run_measures / seed_stats.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class RewardChange:
    reward: str
    first: float
    last: float
    delta: float
    improved: bool  # delta > min_gain; False when not measurable (NaN)
    stderr: float = math.nan  # standard error of delta from the epoch-to-epoch spread


@dataclass(frozen=True)
class RunTrend:
    run: str
    balancer: str
    changes: dict[str, RewardChange]


def auto_window(n_values: int) -> int:
    """A quarter of the logged values, at least 1 and at most 5 epochs."""
    return max(1, min(5, n_values // 4))


def reward_changes(
    metrics: pd.DataFrame, rewards: list[str], window: int | None = None, min_gain: float = 0.0
) -> dict[str, RewardChange]:
    out = {}
    for name in rewards:
        col = f"reward/{name}"
        values = metrics[col].to_numpy(dtype=float) if col in metrics else np.array([])
        values = values[np.isfinite(values)]
        if len(values) < 2:
            out[name] = RewardChange(name, math.nan, math.nan, math.nan, False)
            continue
        w = window or auto_window(len(values))
        head, tail = values[:w], values[-w:]
        delta = float(tail.mean() - head.mean())
        stderr = math.sqrt((head.var(ddof=1) + tail.var(ddof=1)) / w) if w > 1 else math.nan
        out[name] = RewardChange(name, float(head.mean()), float(tail.mean()), delta,
                                 bool(delta > min_gain), stderr)
    return out


def specialist_rewards(metrics: pd.DataFrame, rewards: list[str]) -> dict[str, float]:
    """Specialist reward -> its share of the rollouts over all steps (vs the widest reward)."""
    counts = {}
    for name in rewards:
        col = f"reward_applicable/{name}"
        if col in metrics and metrics[col].notna().any():
            counts[name] = float(metrics[col].sum())  # totals: robust to batches without the source
    if not counts:
        return {}
    widest = max(counts.values())
    if widest <= 0:
        return {}
    return {name: c / widest for name, c in counts.items() if c < widest}


def _fmt(x: float) -> str:
    return "n/a" if not math.isfinite(x) else f"{x:+.4g}"


def run_line(trend: RunTrend, specialists: dict[str, float]) -> str:
    parts = []
    for c in trend.changes.values():
        tag = " (specialist)" if c.reward in specialists else ""
        noise = f" ± {c.stderr:.2g}" if math.isfinite(c.stderr) else ""
        parts.append(f"{c.reward}{tag} {_fmt(c.delta)}{noise} ({c.first:.4g} -> {c.last:.4g})")
    falling = [c.reward for c in trend.changes.values() if not c.improved]
    state = "Every reward improved" if not falling else "Not improving: " + ", ".join(falling)
    return f"`{trend.run}` ({trend.balancer}): " + "; ".join(parts) + f". {state}."
