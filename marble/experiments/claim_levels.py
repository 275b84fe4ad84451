"""The verdict's `levels` (issue 36 item 2): which direction the paper's gradient-harmony figures
describe, and each of ours beside them.

Per run, the means over its diagnostic lines (metrics.jsonl, marble/balancers/levels.py) of
each level's anti-aligned fraction, worst-reward cosine and across-reward variance:

- `fresh_solve`: a fresh min-norm solve on each micro-step's own gradients (`cos_solve*`);
- `applied_micro`: the direction each micro-step applied (`cos*`, `anti_aligned`);
- `step`: the step's accumulated direction against each reward's gradient summed over the
  step (`cos_step*`); `update`: AdamW's parameter change against the same (`cos_update*`).

Beside the paper's 80% / 0% anti-aligned, min cos -0.13 / +0.37 and variance 0.161 / 0.006
(published.HARMONY), each as our value minus the paper's over seeds (a t-test, Holm-adjusted
over every figure of every level and arm, claim_rule; an undecided answer is not a match:
equivalence needs a TOST).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from marble.balancers import min_norm_tolerance
from marble.experiments.claim_rule import SECTION_FAMILIES, decide_family
from marble.report import seed_stats as cs
from marble.report.published import HARMONY

__all__ = ["LEVELS", "PAPER_QUANTITY", "run_levels", "levels_verdict"]

# level -> (anti-aligned key, worst-cosine key, variance key) in metrics.jsonl
LEVELS = {
    "fresh_solve": ("anti_aligned_solve", "cos_solve_min", "cos_solve_var"),
    "applied_micro": ("anti_aligned", "cos_min", "cos_var"),
    "step": ("anti_aligned_step", "cos_step_min", "cos_step_var"),
    "update": ("anti_aligned_update", "cos_update_min", "cos_update_var"),
}
FIGURES = ("anti_aligned_frac", "cos_min_mean", "cos_var_mean")  # published.HARMONY's keys

PAPER_QUANTITY = {
    "level": "fresh_solve",
    "why": ("The reference code logs no cosine (only alpha, raw gradient norms, validity and "
            "staleness), so the page's figures come from a computation it does not release. "
            "MARBLE's published min cos +0.37 and across-reward variance 0.006 fit cosines of a "
            "fresh min-norm solve: at the QP's optimum the KKT conditions make cos(d, g_k) equal "
            "for every reward with alpha_k > 0 (variance near 0, never negative). The amortized "
            "applied direction, the step's sum and Adam's update have no such property. This is "
            "an inference from the figures' form, not a statement of the paper."),
    # The weighted sum has one direction, the same sum on every micro-step, so its published
    # row (80%, min cos -0.13, variance 0.161) is of that direction. A fresh min-norm solve on
    # its batches is not a direction it takes: that row is not set beside the paper's.
    "by_method": {"marble": "fresh_solve", "weighted_sum": "applied_micro"},
}
NOT_ITS_DIRECTION = "not this arm's direction: it never solves, so the paper's row is not of it"


def run_levels(metrics: pd.DataFrame) -> dict[str, dict[str, float]]:
    """level -> {FIGURES key: mean over the run's lines that have it} (NaN when none)."""
    out = {}
    for level, cols in LEVELS.items():
        out[level] = {}
        for fig, col in zip(FIGURES, cols):
            v = metrics[col].to_numpy(float) if col in metrics else np.array([])
            v = v[np.isfinite(v)]
            out[level][fig] = float(v.mean()) if len(v) else math.nan
    return out


def _versus_paper(values: list[float], paper: float) -> dict:
    """Ours beside the paper's; the answer is set by levels_verdict's Holm family."""
    diffs = [v - paper for v in values]
    return {"ours": cs.t_interval(values).as_json(), "paper": paper,
            "ours_minus_paper": cs.t_interval(diffs).as_json(), "per_seed": diffs}


def _solves(method: str) -> bool:
    try:
        return min_norm_tolerance(method) is not None
    except ValueError:  # not a registered balancer: nothing says it solves
        return False


def levels_verdict(per_run: dict[str, list[dict]], arm_methods: dict[str, str]) -> dict:
    """`per_run`: arm -> its runs' `run_levels`; `arm_methods`: arm -> balancer method. Every
    level of every arm whose method has a published row (weighted sum, MARBLE), beside it;
    the fresh-solve level of an arm that never solves has no paper figure (NOT_ITS_DIRECTION).
    Every answer against the paper is Holm-adjusted over them all (SECTION_FAMILIES["levels"])."""
    arms, tests = {}, {}
    for arm, runs in per_run.items():
        method = arm_methods.get(arm, "")
        paper = HARMONY.get(method)
        if paper is None or not runs:
            continue
        arms[arm] = {}
        for level in LEVELS:
            if level == "fresh_solve" and not _solves(method):
                arms[arm][level] = {fig: {"ours": cs.t_interval([r[level][fig] for r in runs]).as_json(),
                                          "paper": None, "answer": NOT_ITS_DIRECTION}
                                    for fig in FIGURES}
                continue
            arms[arm][level] = {fig: _versus_paper([r[level][fig] for r in runs], paper[fig])
                                for fig in FIGURES}
            tests.update({(arm, level, fig): arms[arm][level][fig] for fig in FIGURES})
    decide_family(tests, SECTION_FAMILIES["levels"])
    return {"paper_quantity": dict(PAPER_QUANTITY), "published": {m: dict(v) for m, v in HARMONY.items()},
            "keys": {level: list(cols) for level, cols in LEVELS.items()}, "arms": arms}
