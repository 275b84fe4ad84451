"""Statistics that decide (issue 26 item 3): intervals over seeds, paired differences, power.

Pure functions on per-seed numbers, unit-tested against hand calculations
(tests/test_claim_stats.py). Seeds are independent draws (`data.sampler_seeds: keyed`), so
a value per seed is one sample; two arms with the same seed share the prompt plan, the
rollout noise and the initial model, so their per-seed difference is a paired sample.

Every question ends `True`, `False` or the string "no difference larger than X": the 95%
interval contains 0 and excludes every effect beyond X (X = the larger of |low|, |high|).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy import stats

LEVEL = 0.95  # two-sided interval level (alpha = 0.05)
POWER = 0.80


def json_number(x: float):
    """NaN and infinities -> None: verdict files stay strict JSON."""
    return float(x) if math.isfinite(x) else None


@dataclass(frozen=True)
class Interval:
    mean: float
    low: float
    high: float
    n: int
    sd: float  # sample standard deviation (ddof 1) of the values

    def as_json(self) -> dict:
        return {"mean": json_number(self.mean), "low": json_number(self.low),
                "high": json_number(self.high), "n": self.n, "sd": json_number(self.sd)}


def t_interval(values, level: float = LEVEL, sd_floor: float = 0.0,
               bounds: tuple[float, float] | None = None) -> Interval:
    """Mean and the Student-t interval of the finite values (NaN bounds below two values).

    `sd_floor`: the spread one value has by itself (a fraction's sampling error): a sample
    sd below it is taken as the floor, so two seeds that agree by chance (anti-aligned
    fractions move in steps of 1/30) cannot give an interval of zero width.
    `bounds`: the range the quantity can take (a fraction [0, 1], a difference of two
    [-1, 1]); the interval is cut to it, so two seeds answer "no difference larger than 1",
    not a bound no fraction can reach (the t interval on one degree of freedom is 12.7
    standard errors wide)."""
    xs = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    n = len(xs)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0, math.nan)
    mean = sum(xs) / n
    if n < 2:
        return Interval(mean, math.nan, math.nan, 1, math.nan)
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    if math.isfinite(sd_floor):
        sd = max(sd, sd_floor)
    half = stats.t.ppf(0.5 + level / 2, n - 1) * sd / math.sqrt(n)
    low, high = mean - half, mean + half
    if bounds is not None:
        low, high = max(low, bounds[0]), min(high, bounds[1])
    return Interval(mean, low, high, n, sd)


def no_difference(x: float) -> str:
    return f"no difference larger than {x:.3g}"


def decide(iv: Interval):
    """True (interval above 0), False (below 0), else "no difference larger than X"; an
    interval that cannot be computed (under two seeds) bounds nothing: X = inf."""
    if not (math.isfinite(iv.low) and math.isfinite(iv.high)):
        return no_difference(math.inf)
    if iv.low > 0:
        return True
    if iv.high < 0:
        return False
    return no_difference(max(abs(iv.low), abs(iv.high)))


def bound_of(answer) -> float:
    """X of a "no difference larger than X" answer (NaN for True / False)."""
    if isinstance(answer, bool):
        return math.nan
    return float(answer.rsplit(" ", 1)[1])


def all_of(answers: list):
    """Every part must hold: False if any is False, True if all are True, else the largest X."""
    if not answers:
        return no_difference(math.inf)
    if any(a is False for a in answers):
        return False
    if all(a is True for a in answers):
        return True
    return no_difference(max(bound_of(a) for a in answers if not isinstance(a, bool)))


def minimal_detectable_difference(sd: float, n: int, level: float = LEVEL,
                                  power: float = POWER) -> float:
    """The smallest true mean (paired difference or change) a two-sided t-test at `level`
    detects with probability `power` from n seeds of spread sd:
    (t_{1-a/2, n-1} + t_{power, n-1}) sd / sqrt(n)."""
    if n < 2 or not math.isfinite(sd):
        return math.inf
    df = n - 1
    return (stats.t.ppf(0.5 + level / 2, df) + stats.t.ppf(power, df)) * sd / math.sqrt(n)


def seeds_needed(sd: float, effect: float, level: float = LEVEL, power: float = POWER,
                 most: int = 1000) -> int | None:
    """The fewest seeds whose minimal detectable difference is <= |effect| (None: over `most`
    or no effect)."""
    if not (math.isfinite(sd) and math.isfinite(effect)) or effect == 0:
        return None
    for n in range(2, most + 1):
        if minimal_detectable_difference(sd, n, level, power) <= abs(effect):
            return n
    return None


def paired(a: dict[int, float], b: dict[int, float], sd_floor: float = 0.0,
           bounds: tuple[float, float] | None = None) -> Interval:
    """Interval of a - b over the seeds both have (seed -> value), cut to `bounds`."""
    return t_interval([a[s] - b[s] for s in sorted(set(a) & set(b))], sd_floor=sd_floor, bounds=bounds)


def fraction_se(fraction: float, steps: int) -> float:
    """Sampling error of a fraction of `steps` Bernoulli steps, Jeffreys-smoothed so a run at
    0% or 100% still has one: p = (k + 1/2) / (n + 1), sqrt(p (1 - p) / n); NaN without steps."""
    if steps <= 0 or not math.isfinite(fraction):
        return math.nan
    p = (fraction * steps + 0.5) / (steps + 1)
    return math.sqrt(p * (1 - p) / steps)


def pooled_se(values: list[float]) -> float:
    """sqrt(mean of squares) of the finite values (0 when none): the per-sample floor of a
    mean or a paired difference of fractions."""
    xs = [v * v for v in values if math.isfinite(v)]
    return math.sqrt(sum(xs) / len(xs)) if xs else 0.0


def sentence(question: str, answer) -> str:
    """One sentence in the verdict's words."""
    if answer is True:
        return f"{question}: true."
    if answer is False:
        return f"{question}: false."
    return f"{question}: {answer}."


# ------------------------------------------------------------------ tests and their families


def t_pvalue(values) -> float:
    """Two-sided one-sample t-test p of mean = 0 over the finite values (NaN below two, or a
    zero spread with mean 0; 0 for a zero spread with mean != 0)."""
    xs = [float(v) for v in values if v is not None and math.isfinite(float(v))]
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
    finite = sorted((p, name) for name, p in pvalues.items() if math.isfinite(p))
    m, out, running = len(finite), {name: math.nan for name in pvalues}, 0.0
    for i, (p, name) in enumerate(finite):
        running = max(running, min(1.0, (m - i) * p))
        out[name] = running
    return out


def tost(values, margin: float) -> float:
    """Two one-sided t-tests of |mean| < margin (equivalence): the larger of the two one-sided
    p-values; equivalence is claimed only when it is below 1 - LEVEL. NaN when no margin or
    fewer than two values."""
    xs = [float(v) for v in values if v is not None and math.isfinite(float(v))]
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
