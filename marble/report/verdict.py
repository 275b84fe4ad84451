"""The verdict: did MARBLE keep every reward improving where the weighted sum diluted
the specialist? Pure functions on metrics frames, so every outcome is unit-tested.

A reward's change is the mean of its last `window` logged values minus the mean of its
first `window` (NaN-aware). A specialist is a reward applicable to a strict subset of
the rollouts: its `reward_applicable/<name>` count is below the largest count of any
reward (a general reward applies to every rollout; no total is logged, so the largest
count stands for it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

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

    @property
    def within_noise(self) -> bool:
        """|delta| below two standard errors: the sign may be noise."""
        return math.isfinite(self.stderr) and abs(self.delta) < 2 * self.stderr


@dataclass(frozen=True)
class RunTrend:
    run: str
    balancer: str
    changes: dict[str, RewardChange]

    @property
    def all_improved(self) -> bool:
        return bool(self.changes) and all(c.improved for c in self.changes.values())


@dataclass
class Verdict:
    outcomes: dict[str, str]  # marble run -> outcome code
    text: str
    run_lines: list[str] = field(default_factory=list)


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


def _spec_changes(trend: RunTrend, specialists: dict[str, float]) -> str:
    return ", ".join(f"{s} {_fmt(trend.changes[s].delta)}" for s in specialists if s in trend.changes)


def _general_clause(marble: RunTrend, ws: RunTrend, specialists: dict[str, float]) -> str:
    """Which general (non-specialist) rewards improved under each balancer."""
    def improving(t: RunTrend) -> str:
        names = [c.reward for c in t.changes.values() if c.reward not in specialists and c.improved]
        return ", ".join(names) or "none"
    return (f"General rewards improving: {improving(marble)} under MARBLE, "
            f"{improving(ws)} under the weighted sum.")


def compare(marble: RunTrend, ws: RunTrend, specialists: dict[str, float]) -> tuple[str, str]:
    """(outcome code, sentence) for one MARBLE run against one weighted-sum run."""
    names = ", ".join(f"{s} ({share:.0%} of rollouts)" for s, share in specialists.items())
    m_spec = all(marble.changes[s].improved for s in specialists if s in marble.changes)
    ws_spec = all(ws.changes[s].improved for s in specialists if s in ws.changes)
    m_spec_txt, ws_spec_txt = _spec_changes(marble, specialists), _spec_changes(ws, specialists)
    falling = [c.reward for c in marble.changes.values() if not c.improved]
    if marble.all_improved and not ws_spec:
        return "marble_keeps_all_ws_dilutes", (
            f"Yes: MARBLE (`{marble.run}`) kept every reward improving while the weighted sum "
            f"(`{ws.run}`) diluted the specialist {names}: specialist change {m_spec_txt} under "
            f"MARBLE vs {ws_spec_txt} under the weighted sum."
        )
    if marble.all_improved and ws_spec:
        return "both_fine", (
            f"No dilution seen: both MARBLE (`{marble.run}`) and the weighted sum (`{ws.run}`) "
            f"improved the specialist {names} ({m_spec_txt} vs {ws_spec_txt}); MARBLE kept every "
            f"reward improving."
        )
    if not m_spec and not ws_spec:
        failed = ", ".join(s for s in specialists
                           if s in marble.changes and not marble.changes[s].improved)
        return "marble_also_dilutes", (
            f"No: under MARBLE (`{marble.run}`) the specialist {failed} did not improve either "
            f"(specialists {names}: {m_spec_txt} under MARBLE, {ws_spec_txt} under the weighted "
            f"sum `{ws.run}`). {_general_clause(marble, ws, specialists)}"
        )
    if not m_spec:
        return "ws_fine_marble_dilutes", (
            f"No, the reverse: the specialist {names} improved under the weighted sum "
            f"(`{ws.run}`, {ws_spec_txt}) but not under MARBLE (`{marble.run}`, {m_spec_txt})."
        )
    ws_state = "diluted it" if not ws_spec else "improved it too"
    return "marble_not_all", (
        f"Partly: MARBLE (`{marble.run}`) improved the specialist {names} ({m_spec_txt}) but not "
        f"every reward (not improving: {', '.join(falling)}); the weighted sum (`{ws.run}`) "
        f"{ws_state} ({ws_spec_txt})."
    )


def indistinguishable(marble: RunTrend, ws: RunTrend) -> bool:
    """True when every shared reward's change differs between the two runs by less than
    the changes' own standard error. Runs draw the same prompts per epoch (same seed), so
    a change that is the same under both balancers comes from the prompt draw, not the
    balancer, and the verdict must say so rather than credit either."""
    gaps = []
    for name, m in marble.changes.items():
        w = ws.changes.get(name)
        if w is None or not (math.isfinite(m.delta) and math.isfinite(w.delta)):
            continue
        noise = max(m.stderr, w.stderr)
        if not math.isfinite(noise):
            return False
        gaps.append(abs(m.delta - w.delta) < noise)
    return bool(gaps) and all(gaps)


def verdict(trends: list[RunTrend], specialists: dict[str, float]) -> Verdict:
    """Compare each MARBLE run with the first weighted-sum run (runs in the given order)."""
    lines = [run_line(t, specialists) for t in trends]
    marbles = [t for t in trends if t.balancer == "marble"]
    wss = [t for t in trends if t.balancer == "weighted_sum"]
    if not marbles or not wss:
        missing = "a MARBLE run" if not marbles else "a weighted-sum run"
        names = ", ".join(t.run for t in trends) or "none"
        text = f"No verdict: it needs {missing} to compare (runs: {names})."
        return Verdict({t.run: "incomplete" for t in marbles}, text, lines)
    if not specialists:
        outcomes, sentences = {}, []
        for m in marbles:
            outcomes[m.run] = "no_specialist"
            state = "kept every reward improving" if m.all_improved else "did not keep every reward improving"
            sentences.append(f"MARBLE (`{m.run}`) {state}.")
        ws_state = "kept" if wss[0].all_improved else "did not keep"
        text = (
            "No specialist reward found (every reward applied to the same number of rollouts), so "
            f"dilution cannot be judged. {' '.join(sentences)} The weighted sum (`{wss[0].run}`) "
            f"{ws_state} every reward improving."
        )
        return Verdict(outcomes, text, lines)
    outcomes, sentences = {}, []
    for m in marbles:
        outcomes[m.run], sentence = compare(m, wss[0], specialists)
        sentences.append(sentence)
    same = [f"`{m.run}`" for m in marbles if indistinguishable(m, wss[0])]
    if same:
        sentences.append(
            f"But {', '.join(same)} and the weighted sum (`{wss[0].run}`) changed every reward "
            "by the same amount within one standard error: on these identical prompt draws the "
            "change reflects the prompts, not the balancer, so this run cannot tell them apart "
            "(train longer, or on a model whose images respond more to the policy).")
    noisy = sorted({f"`{t.run}`" for t in marbles + wss[:1] for s in specialists
                    if s in t.changes and t.changes[s].within_noise})
    if noisy:
        sentences.append(f"Caution: the specialist's change is within two standard errors of "
                         f"its epoch-to-epoch noise in {', '.join(noisy)}; train longer to be sure.")
    return Verdict(outcomes, " ".join(sentences), lines)
