"""The claim experiment's tests and their families (issue 36): one-sample t p-values, Holm's
step-down adjustment, TOST equivalence, seed halves for replication and the pilot's power.

Only the experiment asks several questions of one set of runs, so only it needs a
family-wise adjustment; the intervals and answers it shares with the demo's verdict stay in
marble.report.seed_stats (tests/test_claim_stats.py, tests/test_claim_design.py by hand).
"""

from __future__ import annotations

import math

from scipy import stats

from marble.report.seed_stats import (LEVEL, finite, json_number, minimal_detectable_difference,
                                      seeds_needed, t_interval)


def t_pvalue(values) -> float:
    """Two-sided one-sample t-test p of mean = 0 over the finite values (NaN below two, or a
    zero spread with mean 0; 0 for a zero spread with mean != 0)."""
    xs = finite(values)
    if len(xs) < 2:
        return math.nan
    mean = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))
    if sd == 0:
        return math.nan if mean == 0 else 0.0
    t = mean / (sd / math.sqrt(len(xs)))
    return float(2 * stats.t.sf(abs(t), len(xs) - 1))


def holm(pvalues: dict) -> dict:
    """Holm's step-down adjustment of a family {name: p}: sorted ascending, p_(i) x (m - i + 1),
    made monotone and capped at 1; a NaN p stays NaN and does not count in m."""
    ranked = sorted((p, name) for name, p in pvalues.items() if math.isfinite(p))
    m, out, running = len(ranked), {name: math.nan for name in pvalues}, 0.0
    for i, (p, name) in enumerate(ranked):
        running = max(running, min(1.0, (m - i) * p))
        out[name] = running
    return out


def tost(values, margin: float) -> float:
    """Two one-sided t-tests of |mean| < margin (equivalence): the larger of the two one-sided
    p-values; equivalence is claimed only when it is below 1 - LEVEL. NaN when no margin or
    fewer than two values."""
    xs = finite(values)
    if len(xs) < 2 or not (math.isfinite(margin) and margin > 0):
        return math.nan
    n, mean = len(xs), sum(xs) / len(xs)
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    if sd == 0:
        return 0.0 if abs(mean) < margin else 1.0
    se = sd / math.sqrt(n)
    p_low = stats.t.sf((mean + margin) / se, n - 1)  # H0: mean <= -margin
    p_high = stats.t.cdf((mean - margin) / se, n - 1)  # H0: mean >= +margin
    return float(max(p_low, p_high))


def adjusted_answer(mean: float, p_adjusted: float, alpha: float = 1 - LEVEL):
    """True / False when the Holm-adjusted p is below alpha (the sign of the mean), else the
    sentence that the family-wise test shows no difference."""
    if math.isfinite(p_adjusted) and p_adjusted < alpha:
        return bool(mean > 0)
    shown = "n/a" if not math.isfinite(p_adjusted) else f"{p_adjusted:.3g}"
    return f"no difference shown after Holm adjustment (p = {shown})"


def answer_kind(answer) -> str:
    """What a verdict answer says, for comparing two verdicts: true, false or none shown."""
    if answer is True:
        return "true"
    if answer is False:
        return "false"
    return "no difference shown"


def halves(seeds: list) -> tuple[list, list]:
    """Two disjoint seed sets: the sorted seeds' first and second halves (an odd seed out)."""
    s = sorted(seeds)
    h = len(s) // 2
    return s[:h], s[h:2 * h]


def pilot_powered(pilot_values, n: int, effect: float) -> dict:
    """Power fixed before the main run: the pilot's per-seed values give the sd; the design's
    n seeds detect `effect` when the minimal detectable difference is <= it."""
    iv = t_interval(pilot_values)
    mdd = minimal_detectable_difference(iv.sd, n)
    return {"pilot_sd": json_number(iv.sd), "pilot_seeds": iv.n,
            "minimal_detectable_difference": json_number(mdd),
            "powered": bool(math.isfinite(effect) and mdd <= abs(effect)),
            "seeds_needed": seeds_needed(iv.sd, effect)}


def null_as_nan(x):
    """None -> NaN through dicts and lists: a strict JSON file's null read back as the missing
    value the statistics expect (the pilot file and the per-seed file: one reader rule)."""
    if x is None:
        return math.nan
    if isinstance(x, dict):
        return {k: null_as_nan(v) for k, v in x.items()}
    if isinstance(x, list):
        return [null_as_nan(v) for v in x]
    return x
