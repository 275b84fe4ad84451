"""The paper's claim, measured with its uncertainty (pure functions, unit-tested).

Runs of one balancer (several seeds) are pooled: a reward's change under a balancer is
the mean of its runs' changes, with a standard error that is the larger of
- the spread between runs (std / sqrt(n), needs n >= 2): seed-to-seed variation, and
- the runs' own epoch-to-epoch standard errors (sqrt(mean se^2 / n)).
With two or three seeds the between-run spread alone is a poor estimate of the noise
(it can come out near zero by chance), so the within-run term is a floor.

Three questions, each answered true / false / "inconclusive" from those numbers:
(a) every reward rises under MARBLE (beyond `z` standard errors);
(b) every specialist rises more under MARBLE than under the weighted sum, beyond `z`
    standard errors of the difference;
(c) the fraction of anti-aligned diagnostic steps per run, beside the paper's
    80% (weighted sum) and 0% (MARBLE).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from marble.report.published import HARMONY
from marble.report.verdict import RunTrend

Z = 2.0  # "beyond the error bars": two standard errors (about 95% for a normal estimate)
PUBLISHED_ANTI_ALIGNED = {bal: v["anti_aligned_frac"] for bal, v in HARMONY.items()}
INCONCLUSIVE = "inconclusive"


@dataclass(frozen=True)
class Change:
    mean: float
    se: float
    runs: int

    def pair(self) -> list:
        return [json_number(self.mean), json_number(self.se)]


def json_number(x: float):
    return float(x) if math.isfinite(x) else None


def pooled_change(deltas: list[float], stderrs: list[float]) -> Change:
    """Mean change over runs and its standard error (see module docstring)."""
    pairs = [(d, s) for d, s in zip(deltas, stderrs) if math.isfinite(d)]
    n = len(pairs)
    if n == 0:
        return Change(math.nan, math.nan, 0)
    values = [d for d, _ in pairs]
    mean = sum(values) / n
    between = (math.sqrt(sum((d - mean) ** 2 for d in values) / (n - 1) / n)
               if n >= 2 else math.nan)
    within_sq = [s * s for _, s in pairs if math.isfinite(s)]
    within = math.sqrt(sum(within_sq) / len(within_sq) / n) if within_sq else math.nan
    finite = [x for x in (between, within) if math.isfinite(x)]
    return Change(mean, max(finite) if finite else math.nan, n)


def balancer_changes(trends: list[RunTrend]) -> dict[str, dict[str, Change]]:
    """balancer -> reward -> pooled Change over that balancer's runs."""
    out: dict[str, dict[str, Change]] = {}
    for balancer in dict.fromkeys(t.balancer for t in trends):
        runs = [t for t in trends if t.balancer == balancer]
        rewards = list(dict.fromkeys(r for t in runs for r in t.changes))
        out[balancer] = {
            r: pooled_change([t.changes[r].delta for t in runs if r in t.changes],
                             [t.changes[r].stderr for t in runs if r in t.changes])
            for r in rewards
        }
    return out


def sign_beyond(mean: float, se: float, z: float = Z):
    """True above +z se, False below -z se, "inconclusive" in between or unmeasurable.

    A change with no error bar (a single run of a single window) is inconclusive: the
    claim needs its uncertainty."""
    if not (math.isfinite(mean) and math.isfinite(se)):
        return INCONCLUSIVE
    if mean > z * se:
        return True
    if mean < -z * se:
        return False
    return INCONCLUSIVE


def all_of(answers: list):
    """False if any is False, True if all are True, else inconclusive (also when empty)."""
    if any(a is False for a in answers):
        return False
    if answers and all(a is True for a in answers):
        return True
    return INCONCLUSIVE


def every_reward_rises(changes: dict[str, Change], z: float = Z):
    """(a): each reward's pooled change under one balancer is above zero beyond z se."""
    return all_of([sign_beyond(c.mean, c.se, z) for c in changes.values()])


def difference(a: Change, b: Change) -> Change:
    """a - b for independent runs: the standard errors add in quadrature."""
    return Change(a.mean - b.mean, math.hypot(a.se, b.se), min(a.runs, b.runs))


def rise_more_by_specialist(marble: dict[str, Change], ws: dict[str, Change],
                            specialists: list[str], z: float = Z) -> dict:
    """Per specialist: its change under MARBLE minus under the weighted sum, beyond z se?"""
    shared = [s for s in specialists if s in marble and s in ws]
    return {s: sign_beyond(difference(marble[s], ws[s]).mean, difference(marble[s], ws[s]).se, z)
            for s in shared}


def specialists_rise_more(marble: dict[str, Change], ws: dict[str, Change],
                          specialists: list[str], z: float = Z):
    """(b): every specialist's change under MARBLE minus under the weighted sum > z se."""
    return all_of(list(rise_more_by_specialist(marble, ws, specialists, z).values()))


def _fmt(c: Change) -> str:
    if not math.isfinite(c.mean):
        return "n/a"
    return f"{c.mean:+.3g} ± {c.se:.2g}" if math.isfinite(c.se) else f"{c.mean:+.3g} (no error bar)"


def _answer(a) -> str:
    return {True: "yes", False: "no"}.get(a, INCONCLUSIVE) if isinstance(a, bool) else INCONCLUSIVE


def claim_lines(by_balancer: dict[str, dict[str, Change]], specialists: list[str],
                anti_by_balancer: dict[str, float], z: float = Z,
                anti_ws_direction: dict[str, float] | None = None,
                anti_by_step_kind: dict[str, dict] | None = None) -> tuple[dict, list[str]]:
    """({question: answer}, sentences) for (a), (b), (c)."""
    marble, ws = by_balancer.get("marble"), by_balancer.get("weighted_sum")
    answers: dict = {}
    lines = []
    if marble:
        answers["every_reward_rises_under_marble"] = a = every_reward_rises(marble, z)
        detail = "; ".join(f"{r} {_fmt(c)} ({c.runs} runs)" for r, c in marble.items())
        lines.append(f"(a) Every reward rises under MARBLE (beyond {z:g} standard errors): "
                     f"{_answer(a).upper()}. Change per reward: {detail}.")
    else:
        answers["every_reward_rises_under_marble"] = INCONCLUSIVE
        lines.append("(a) Every reward rises under MARBLE: inconclusive (no MARBLE run).")
    if marble and ws and specialists:
        answers["specialists_rise_more_under_marble"] = b = specialists_rise_more(
            marble, ws, specialists, z)
        answers["specialist_rises_more_under_marble"] = rise_more_by_specialist(
            marble, ws, specialists, z)
        per = answers["specialist_rises_more_under_marble"]
        detail = "; ".join(
            f"{s}: MARBLE {_fmt(marble[s])} vs weighted sum {_fmt(ws[s])}, difference "
            f"{_fmt(difference(marble[s], ws[s]))} ({_answer(per[s])})" for s in per)
        lines.append(f"(b) The specialists rise more under MARBLE than under the weighted sum "
                     f"(beyond {z:g} standard errors of the difference): {_answer(b).upper()}. {detail}.")
    else:
        answers["specialists_rise_more_under_marble"] = INCONCLUSIVE
        why = "no specialist reward" if not specialists else "it needs a MARBLE and a weighted-sum run"
        lines.append(f"(b) Specialists rise more under MARBLE: inconclusive ({why}).")
    shown = ", ".join(f"{b} {f:.0%}" for b, f in anti_by_balancer.items() if math.isfinite(f))
    ws_dir = ", ".join(f"{b} {f:.0%}" for b, f in (anti_ws_direction or {}).items()
                       if math.isfinite(f))
    ws_txt = (f" (the weighted-sum direction on the same batches: {ws_dir})" if ws_dir else "")
    lines.append(f"(c) Steps with an anti-aligned reward (the applied direction against some "
                 f"reward's gradient): {shown or 'not logged'}{ws_txt}; published (MARBLE "
                 f"project page): weighted sum 80%, MARBLE 0%.{_step_kind_text(anti_by_step_kind)}")
    return answers, lines


def _step_kind_text(kinds: dict[str, dict] | None) -> str:
    """The applied direction split into full-solve and amortized steps, per solving balancer."""
    parts = []
    for balancer, k in (kinds or {}).items():
        solve, amortized = k.get("full_solve"), k.get("amortized")
        if solve is None or not math.isfinite(solve):
            continue
        text = f"{balancer}: full-solve steps {solve:.0%} ({k.get('solve_steps', 0)} steps)"
        if amortized is not None and math.isfinite(amortized):
            text += f", amortized steps {amortized:.0%}"
        parts.append(text)
    if not parts:
        return ""
    return (" Split by step kind: " + "; ".join(parts) + ". A fresh min-norm solve cannot oppose "
            "a reward (d.g_k >= |d|^2); between solves the cached EMA alpha can.")
