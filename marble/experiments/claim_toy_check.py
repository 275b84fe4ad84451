"""Can (b) be decided on the claim's toy? The pilot's check (issue 47 item 1).

(b) asks whether a specialist rises more under MARBLE than under the weighted sum because the
weighted sum dilutes its signal. That is testable only for a specialist that

1. rises when trained alone, in both seed halves (each half's test, claim_rule's Holm rule);
2. has room above it: its held-out level at the end of the alone runs leaves more headroom
   (SCORE_MAX - level) than the alone runs gained, so "rises more" is not capped;
3. is attenuated, not opposed, in the weighted sum's combined advantage: the per-run mean
   slope of the combined advantage on the specialist's own (`attenuation/<reward>`,
   marble.maths.advantages.advantage_slope) lies between 0 and 1, by two tests in one Holm
   family (slope > 0 and slope < 1). Why the slope and not the correlation: the correlation
   (`dilution/`) falls as much when the other rewards add independent signal as when they
   pull against the specialist; the slope is below 0 only in the second case.

Pure functions of RunMeasure lists (tests/test_claim_toy_check.py by hand).
"""

from __future__ import annotations

import math

from marble.experiments import claim_family as fam
from marble.experiments.claim_rule import holm_family
from marble.report.seed_stats import finite, json_number
from marble.workflow.claim import ALONE_PREFIX

__all__ = ["SCORE_MAX", "attenuation_answer", "learnable_in_halves", "room_above", "b_conditions"]

# the toy rewards' best score (docs/rewards.md): RMS contrast is at most 0.5, every other 1
SCORE_MAX = {"toy_text_contrast": 0.5}


def attenuation_answer(slopes: list[float]) -> dict:
    """`attenuated` (0 < slope < 1 by both tests), `opposed` (slope < 0), `amplified`
    (slope > 1), else `undecided`; with each test's p and Holm p."""
    xs = finite(slopes)
    tests = holm_family({"above_0": xs, "below_1": [x - 1 for x in xs]})
    above, below = tests["above_0"]["answer"], tests["below_1"]["answer"]
    if above is False:
        kind = "opposed"
    elif below is True:
        kind = "amplified"
    elif above is True and below is False:
        kind = "attenuated"
    else:
        kind = "undecided"
    mean = sum(xs) / len(xs) if xs else math.nan
    return {"per_seed": [json_number(x) for x in slopes], "mean": json_number(mean), "tests": tests,
            "answer": kind}


def learnable_in_halves(by_seed: dict[int, float]) -> dict:
    """The alone change tested in each seed half (fam.halves): rises in both only when both
    halves' tests say true."""
    first, second = fam.halves(sorted(by_seed))
    answers = [holm_family({"change": [by_seed[s] for s in half]})["change"]["answer"]
               for half in (first, second)]
    return {"seeds": sorted(by_seed), "per_seed": [json_number(by_seed[s]) for s in sorted(by_seed)],
            "seed_sets": [first, second], "answers": answers,
            "rises_in_both": all(a is True for a in answers)}


def room_above(final_levels: list[float], changes: list[float], reward: str) -> dict:
    """Headroom at the end of the alone runs against what they gained (means over seeds)."""
    end, gain = finite(final_levels), finite(changes)
    level = sum(end) / len(end) if end else math.nan
    gained = sum(gain) / len(gain) if gain else math.nan
    room = SCORE_MAX.get(reward, 1.0) - level
    return {"end_level": json_number(level), "max": SCORE_MAX.get(reward, 1.0), "room": json_number(room),
            "alone_gain": json_number(gained),
            "answer": bool(math.isfinite(room) and math.isfinite(gained) and room > abs(gained))}


def b_conditions(measures, specialists, baseline: str) -> dict:
    """specialist -> the three conditions and `decidable` (all three hold); a specialist with
    no alone arm in the pilot is not decidable, and says why."""
    out = {}
    for s in specialists:
        alone = [m for m in measures if m.arm == f"{ALONE_PREFIX}{s}"]
        slopes = [m.attenuation.get(s, math.nan) for m in sorted(measures, key=lambda m: m.seed)
                  if m.arm == baseline]
        att = attenuation_answer(slopes)
        if not alone:
            out[s] = {"attenuation": att, "decidable": False, "why": "no alone arm in the pilot"}
            continue
        learn = learnable_in_halves({m.seed: m.changes.get(s, math.nan) for m in alone})
        room = room_above([m.final.get(s, math.nan) for m in alone], [m.changes.get(s, math.nan) for m in alone], s)
        out[s] = {"learnable_alone": learn, "room_above": room, "attenuation": att,
                  "decidable": bool(learn["rises_in_both"] and room["answer"] and att["answer"] == "attenuated")}
    return out
