"""Statistics that decide (issue 26 item 3): intervals over seeds, paired differences, power.

Pure functions on per-seed numbers, unit-tested against hand calculations
(tests/test_claim_stats.py). Both the demo's verdict (marble.report.demo_claim) and the claim
experiment (marble.experiments) decide with them: one definition of an interval and an answer.
The experiment's multiple-testing family (Holm, TOST, halves) is marble.experiments.claim_family.
Seeds are independent draws (`data.sampler_seeds: keyed`), so
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


def finite(values) -> list[float]:
    """The finite values as floats (None, NaN and infinities dropped): every statistic here and
    in the experiment's family counts exactly these, so the rule is written once."""
    return [float(v) for v in values if v is not None and math.isfinite(float(v))]


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
    xs = finite(values)
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
