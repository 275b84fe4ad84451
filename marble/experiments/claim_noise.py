"""The verdict's `noise` and `dilution` (issue 36 item 3): noise told from conflict, and the
dilution question (b) is about, shown before it is tested.

- `noise.sweep.<arm>`: an arm trained at several micro-batch sizes with the same samples per
  step (`claim.sweep`, arms `<arm>_mb<size>`): per level (claim_levels.LEVELS) the anti-aligned
  fraction at each size (interval over seeds) and whether it falls with batch size, the
  smallest size's fraction minus the largest's, paired by seed. Gradient noise shrinks as a
  micro-batch grows; a conflict between the rewards' objectives does not.
- `noise.control.<control arm>`: the same levels for an arm trained on rewards that cannot
  conflict (`claim.control`: copies of one objective), and `conflict_beyond_control`: the arm's
  fraction minus its control's, paired by seed. Only a fraction above the control's is
  evidence of conflict.
- `dilution.<reward>`: the correlation of the weighted sum's one-per-sample advantage with the
  reward's own group advantage on the samples it applies to (`dilution/<reward>` in
  metrics.jsonl, marble.maths.advantages.advantage_correlation), interval over seeds of each
  run's mean, per arm's rollouts; MARBLE trains on the reward's own advantage: 1 by
  construction.

Pure functions of RunMeasure-like records (`arm`, `seed`, `levels`, `dilution`).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from marble.report import seed_stats as cs
from marble.experiments.claim_levels import LEVELS
from marble.experiments.claim_rule import SECTION_FAMILIES, decide_family
from marble.workflow.claim import CONTROL_PREFIX, sweep_base

__all__ = ["run_dilution", "falls_with_batch_size", "sweep_section", "control_section",
           "dilution_section", "noise_sentences"]

FRACTION, FRACTION_DIFFERENCE = (0.0, 1.0), (-1.0, 1.0)
FIG = "anti_aligned_frac"  # claim_levels.FIGURES' anti-aligned figure


def run_dilution(metrics: pd.DataFrame, rewards: list[str], prefix: str = "dilution") -> dict[str, float]:
    """reward -> the mean over a run's lines of `<prefix>/<reward>` (NaN when never logged);
    prefix `attenuation`: the slope (issue 47) beside the correlation."""
    out = {}
    for r in rewards:
        col = f"{prefix}/{r}"
        v = metrics[col].to_numpy(float) if col in metrics else np.array([])
        v = v[np.isfinite(v)]
        out[r] = float(v.mean()) if len(v) else math.nan
    return out


def _fractions(measures, arm: str, level: str) -> dict[int, float]:
    return {m.seed: (m.levels.get(level) or {}).get(FIG, math.nan) for m in measures if m.arm == arm}


def _paired_values(a: dict[int, float], b: dict[int, float]) -> list[float]:
    return [a[s] - b[s] for s in sorted(set(a) & set(b))]


def falls_with_batch_size(by_size: dict[int, dict[int, float]]) -> dict:
    """`by_size`: micro-batch size -> {seed: anti-aligned fraction}. The smallest size's
    fraction minus the largest's, paired by seed: `per_seed` those differences, `answer` its
    own t-test (a family of one; sweep_section adjusts over its family): true = it falls as
    the micro-batch grows (what noise does), false = it rises; `means` per size, in size order."""
    sizes = sorted(by_size)
    means = {s: cs.json_number(cs.t_interval(by_size[s].values()).mean) for s in sizes}
    if len(sizes) < 2:
        return {"sizes": sizes, "means": means, "difference": None, "per_seed": [],
                "answer": cs.no_difference(math.inf)}
    diffs = _paired_values(by_size[sizes[0]], by_size[sizes[-1]])
    entry = {"sizes": sizes, "means": means,
             "difference": cs.t_interval(diffs, bounds=FRACTION_DIFFERENCE).as_json(), "per_seed": diffs}
    decide_family({0: entry}, "itself")
    return entry


def sweep_groups(arms: list[str], micro_batch: dict[str, int]) -> dict[str, dict[int, str]]:
    """base arm -> {micro-batch size: arm} for every base arm that has sweep arms
    (`<arm>_mb<size>`); the base arm sits at its own `train.batch_size` (`micro_batch`)."""
    groups: dict[str, dict[int, str]] = {}
    for arm in arms:
        parsed = sweep_base(arm)
        if parsed and parsed[0] in arms:
            groups.setdefault(parsed[0], {})[parsed[1]] = arm
    for base, sizes in groups.items():
        if micro_batch.get(base) is not None:
            sizes.setdefault(int(micro_batch[base]), base)
    return {b: dict(sorted(s.items())) for b, s in groups.items()}


def sweep_section(measures, micro_batch: dict[str, int]) -> dict:
    """base arm -> {"arms": size -> arm, "levels": level -> {"by_size": size -> interval,
    "falls_with_batch_size": falls_with_batch_size(...)}}, each answer Holm-adjusted over every
    swept arm and level (claim_rule.SECTION_FAMILIES["noise.sweep"])."""
    arms = list(dict.fromkeys(m.arm for m in measures))
    out, tests = {}, {}
    for base, sizes in sweep_groups(arms, micro_batch).items():
        levels = {}
        for level in LEVELS:
            by_size = {s: _fractions(measures, arm, level) for s, arm in sizes.items()}
            levels[level] = {
                "by_size": {str(s): cs.t_interval(v.values(), bounds=FRACTION).as_json()
                            for s, v in by_size.items()},
                "falls_with_batch_size": falls_with_batch_size(by_size)}
            tests[(base, level)] = levels[level]["falls_with_batch_size"]
        out[base] = {"arms": {str(s): a for s, a in sizes.items()}, "levels": levels}
    decide_family(tests, SECTION_FAMILIES["noise.sweep"])
    return out


def control_section(control, measures) -> dict:
    """control arm -> {"base_arm", "levels": level -> interval of its anti-aligned fraction,
    "conflict_beyond_control": level -> the base arm's fraction minus the control's, paired by
    seed (`answer` true: more anti-aligned than copies of one objective give), Holm-adjusted
    over every control arm and level (claim_rule.SECTION_FAMILIES["noise.control"])}."""
    out, tests = {}, {}
    for arm in dict.fromkeys(m.arm for m in control):
        base = arm[len(CONTROL_PREFIX):]
        entry = {"base_arm": base, "levels": {}, "conflict_beyond_control": {}}
        for level in LEVELS:
            mine = _fractions(control, arm, level)
            entry["levels"][level] = cs.t_interval(mine.values(), bounds=FRACTION).as_json()
            diffs = _paired_values(_fractions(measures, base, level), mine)
            beyond = {"difference": cs.t_interval(diffs, bounds=FRACTION_DIFFERENCE).as_json(),
                      "per_seed": diffs}
            entry["conflict_beyond_control"][level] = tests[(arm, level)] = beyond
        out[arm] = entry
    decide_family(tests, SECTION_FAMILIES["noise.control"])
    return out


def dilution_section(measures, rewards: list[str], specialists: dict, arms: list[str]) -> dict:
    """reward -> {"specialist": bool, "weighted_sum_advantage": arm -> interval over seeds of the
    correlation on that arm's rollouts, "attenuation": arm -> interval of the slope (issue 47:
    0-1 attenuated, < 0 opposed; the figure the pilot's b_decidable rule reads),
    "own_advantage": 1.0 (MARBLE's per-reward term)}."""
    def per_arm(field: str, r: str) -> dict:
        return {a: cs.t_interval([getattr(m, field).get(r, math.nan) for m in measures if m.arm == a],
                                 bounds=None if field == "attenuation" else FRACTION_DIFFERENCE).as_json()
                for a in arms}

    out = {r: {"specialist": r in specialists, "weighted_sum_advantage": per_arm("dilution", r),
               "attenuation": per_arm("attenuation", r), "own_advantage": 1.0} for r in rewards}
    return {"measure": ("Pearson correlation of the weighted sum's one-per-sample group advantage with the "
                        "reward's own group advantage, over the rollouts the reward applies to; mean over "
                        "a run's steps, interval over seeds; 1 = nothing diluted. `attenuation`: the "
                        "least-squares slope of the same (1 carried whole, 0-1 attenuated, < 0 opposed)"),
            "rewards": out}


def _fmt(x) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def _said(answer) -> str:
    """An answer in the verdict's words: true / false / "no difference larger than X"."""
    return str(answer).lower() if isinstance(answer, bool) else str(answer)


def noise_sentences(noise: dict, dilution: dict) -> list[str]:
    """One sentence per sweep, control and specialist, in the verdict's words."""
    out = []
    for base, entry in noise.get("sweep", {}).items():
        parts = []
        for level, v in entry["levels"].items():
            f = v["falls_with_batch_size"]
            means = ", ".join(f"{s}: {_fmt(m)}" for s, m in f["means"].items())
            parts.append(f"{level} ({means}) falls: {_said(f['answer'])}")
        out.append(f"{base}, anti-aligned fraction by micro-batch size: " + "; ".join(parts) + ".")
    for arm, entry in noise.get("control", {}).items():
        beyond = entry["conflict_beyond_control"]
        parts = [f"{level} {_fmt(iv['mean'])} (beyond the control in {entry['base_arm']}: "
                 f"{_said(beyond[level]['answer'])})" for level, iv in entry["levels"].items()]
        out.append(f"No-conflict control {arm}, anti-aligned fraction: " + "; ".join(parts) + ".")
    for r, v in dilution.get("rewards", {}).items():
        if v["specialist"]:
            corr = ", ".join(f"{a} {_fmt(iv['mean'])}" for a, iv in v["weighted_sum_advantage"].items())
            out.append(f"Dilution of {r}: the weighted sum's advantage correlates with its own at {corr} "
                       "(MARBLE's per-reward advantage: 1).")
    return out
