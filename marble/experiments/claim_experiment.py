"""The `claim` experiment's verdict from its runs' measures (docs/claim.md, issue 26).

The per-run measures and questions (a)-(c) are the demo's too (marble.report.run_measures);
this module adds what only the experiment asks: each reward learnable alone, the rewards'
conflict, the full-solve theorem, the effects of interest, the three levels and the dilution
(claim_levels, claim_noise), and the verdict JSON. Pure functions on frames.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pandas as pd

from marble.experiments.claim_levels import levels_verdict, run_levels
from marble.experiments.claim_noise import run_dilution
from marble.experiments.claim_rule import apply_rule
from marble.report import seed_stats as cs
from marble.report.published import PUBLISHED_ANTI_ALIGNED
from marble.report.run_measures import (CHANGE_MEASURE, FRACTION, QUESTIONS, RunMeasure, applied_se, arm_table,
                                        has_heldout,
                                        measure_run, question_a, question_b, question_c)
from marble.report.seed_stats import json_number
from marble.workflow.claim import ALONE_PREFIX

THEOREM_TOL = 1e-6  # a full solve's worst cosine may sit this far below 0 (rounding)


def measure_claim_run(arm: str, seed: int, metrics: pd.DataFrame, rewards: list[str],
                      evals: pd.DataFrame | None, final_step: int | None = None) -> RunMeasure:
    """measure_run plus the experiment's own per-run measures: the three levels and the
    dilution (the demo's verdict asks neither, so the shared measure leaves them empty)."""
    m = measure_run(arm, seed, metrics, rewards, evals, final_step)
    final = {r: float(evals[f"eval_reward/{r}"].iloc[-1]) if has_heldout(evals, final_step)
             and f"eval_reward/{r}" in evals else math.nan for r in rewards}
    return replace(m, levels=run_levels(metrics), dilution=run_dilution(metrics, rewards),
                   attenuation=run_dilution(metrics, rewards, "attenuation"), final=final)


def question_conflict(measures, baseline_arm) -> dict:
    """Do the rewards conflict: is the weighted sum's anti-aligned fraction above 0?"""
    mine = [m for m in measures if m.arm == baseline_arm]
    iv = cs.t_interval([m.anti["applied"] for m in mine],
                       sd_floor=cs.pooled_se([applied_se(m) for m in mine]), bounds=FRACTION)
    return {"answer": cs.decide(iv), "fraction": iv.as_json()}


def question_theorem(measures, min_norm_arms: set[str] | dict | None = None) -> dict:
    """Every full-solve step of every run of a min-norm balancer (`min_norm_arms`: a set, or
    arm -> its solver's tolerance; None: every arm): worst-reward cosine of the solve's
    combination >= -tol. Only the min-norm point of the unit gradients' hull has
    <d, u_k> >= |d|^2; another weighting (UPGrad, CAGrad, random, ...) may oppose a reward on
    its own solve, which the arm's `fresh_solve` fraction shows."""
    tol = {} if not isinstance(min_norm_arms, dict) else dict(min_norm_arms)
    if min_norm_arms is not None:
        measures = [m for m in measures if m.arm in min_norm_arms]
    cos = [m.full_solve_min_cos for m in measures if math.isfinite(m.full_solve_min_cos)]
    worst = min(cos) if cos else math.nan
    steps = sum(m.full_solve_steps for m in measures)
    held = all(m.full_solve_min_cos >= -tol.get(m.arm, THEOREM_TOL) for m in measures
               if math.isfinite(m.full_solve_min_cos))
    arms = sorted({m.arm for m in measures if m.full_solve_steps})
    out = {"answer": bool(steps) and held, "min_cosine": json_number(worst),
           "full_solve_steps": steps, "tolerance": THEOREM_TOL, "arms": arms}
    if tol:  # per-arm tolerances (a looser solver such as torchjd's MGDA) named beside
        out["tolerances"] = {a: tol[a] for a in arms}
    return out


def question_learnable(measures) -> dict:
    """Each reward trained alone (`alone_<reward>` arms) rises: its change's interval > 0."""
    per = {}
    for arm in dict.fromkeys(m.arm for m in measures if m.arm.startswith(ALONE_PREFIX)):
        reward = arm[len(ALONE_PREFIX):]
        iv = cs.t_interval([m.changes.get(reward, math.nan) for m in measures if m.arm == arm])
        per[reward] = {"change": iv.as_json(), "answer": cs.decide(iv)}
    return {"answer": cs.all_of([p["answer"] for p in per.values()]), "per_reward": per}


def effects_of_interest(alone: list[RunMeasure], fraction: float) -> dict[str, float]:
    """reward -> `fraction` x its mean change when trained alone (the `alone_<reward>` arms):
    a balancer's edge smaller than that share of what the reward can gain is not worth one."""
    out = {}
    for arm in dict.fromkeys(m.arm for m in alone):
        reward = arm[len(ALONE_PREFIX):]
        mean = cs.t_interval([m.changes.get(reward, math.nan) for m in alone if m.arm == arm]).mean
        out[reward] = fraction * abs(mean) if math.isfinite(mean) else math.nan
    return out


def _pooled_floor(measures, arms: tuple[str, ...]) -> float:
    """The runs' fraction sampling errors as one sd floor (question_c's and question_conflict's:
    one arm's se, or the hypot of the two arms' per seed)."""
    se = {a: {m.seed: applied_se(m) for m in measures if m.arm == a} for a in arms}
    seeds = sorted(set.intersection(*(set(v) for v in se.values())))
    return cs.pooled_se([math.hypot(*(se[a][s] for a in arms)) for s in seeds])


def rule_values(measures, alone, rewards, specialists, marble_arm, baseline_arm) -> tuple[dict, dict]:
    """(question -> member -> per-seed values, question -> member -> sd floor): what each
    question's Holm family tests (claim_rule.FAMILIES)."""
    def by_seed(arm, get):
        return {m.seed: get(m) for m in measures if m.arm == arm}

    def paired(get):
        a, b = by_seed(marble_arm, get), by_seed(baseline_arm, get)
        return [a[s] - b[s] for s in sorted(set(a) & set(b))]

    values = {
        "a_every_reward_rises_under_marble": {
            r: list(by_seed(marble_arm, lambda m, r=r: m.changes.get(r, math.nan)).values()) for r in rewards},
        "b_specialists_rise_more_under_marble": {
            s: paired(lambda m, s=s: m.changes.get(s, math.nan)) for s in specialists},
        "c_marble_less_anti_aligned": {"anti_aligned": [-d for d in paired(lambda m: m.anti["applied"])]},
        "conflict_weighted_sum_anti_aligned": {
            "anti_aligned": list(by_seed(baseline_arm, lambda m: m.anti["applied"]).values())},
    }
    floors = {"c_marble_less_anti_aligned": {"anti_aligned": _pooled_floor(measures, (baseline_arm, marble_arm))},
              "conflict_weighted_sum_anti_aligned": {"anti_aligned": _pooled_floor(measures, (baseline_arm,))}}
    if alone:
        values["every_reward_learnable_alone"] = {
            a[len(ALONE_PREFIX):]: [m.changes.get(a[len(ALONE_PREFIX):], math.nan) for m in alone if m.arm == a]
            for a in dict.fromkeys(m.arm for m in alone)}
    return values, floors


def claim_verdict(measures: list[RunMeasure], rewards: list[str], specialists: dict[str, float],
                  marble_arm: str, baseline_arm: str, effect_fraction: float = 0.5,
                  min_norm_arms: set[str] | dict | None = None,
                  arm_methods: dict[str, str] | None = None,
                  fixed_effects: dict[str, float] | None = None) -> dict:
    """The verdict JSON (keys documented in docs/claim.md). `effect_fraction`: the smallest
    effect of interest as a fraction of a specialist's change trained alone (question b) and
    of the paper's anti-aligned difference, 80% - 0% (question c). `min_norm_arms`: the arms
    the full-solve theorem holds for (None: all). `fixed_effects`: specialist -> (b)'s effect of
    interest in absolute units, fixed before the run by the committed pilot (claim_design.
    pilot_effects); without it, `effect_fraction` of this run's alone change (observed, said
    so in `effect_of_interest_source`). Without alone arms (the zoo) the learnability question
    is not asked."""
    arms = list(dict.fromkeys(m.arm for m in measures))
    for need in (marble_arm, baseline_arm):
        if need not in arms:
            raise ValueError(f"claim: arm {need!r} has no runs (arms: {', '.join(arms) or 'none'})")
    alone = [m for m in measures if m.arm.startswith(ALONE_PREFIX)]
    measures = [m for m in measures if not m.arm.startswith(ALONE_PREFIX)]
    arms = [a for a in arms if not a.startswith(ALONE_PREFIX)]
    table = arm_table(measures, rewards, baseline_arm)
    questions = {
        **({"every_reward_learnable_alone": question_learnable(alone)} if alone else {}),
        "a_every_reward_rises_under_marble": question_a(measures, rewards, marble_arm),
        "b_specialists_rise_more_under_marble": question_b(
            measures, specialists, marble_arm, baseline_arm,
            fixed_effects or effects_of_interest(alone, effect_fraction)),
        "c_marble_less_anti_aligned": question_c(
            measures, marble_arm, baseline_arm,
            effect_fraction * (PUBLISHED_ANTI_ALIGNED["weighted_sum"] - PUBLISHED_ANTI_ALIGNED["marble"])),
        "conflict_weighted_sum_anti_aligned": question_conflict(measures, baseline_arm),
        "theorem_full_solves_never_anti_aligned": question_theorem(measures, min_norm_arms),
    }
    # Issue 47 item 4: one rule, every answer from its Holm family (claim_rule)
    apply_rule(questions, *rule_values(measures, alone, rewards, specialists, marble_arm, baseline_arm))
    methods = arm_methods or {marble_arm: "marble", baseline_arm: "weighted_sum"}
    levels = levels_verdict({a: [m.levels for m in measures if m.arm == a and m.levels] for a in arms},
                            methods)
    return {
        "arms": arms, "seeds": sorted({m.seed for m in measures}),
        "levels": levels,
        "marble_arm": marble_arm, "baseline_arm": baseline_arm,
        "rewards": rewards, "specialists": specialists, "change_measure": CHANGE_MEASURE,
        "effect_fraction": effect_fraction,
        "effect_of_interest_source": ("the committed pilot (fixed before the run)" if fixed_effects
                                      else "this run's alone arms (observed)"),
        "level": cs.LEVEL, "power": cs.POWER,
        "published_anti_aligned": dict(PUBLISHED_ANTI_ALIGNED),
        "arm_results": {arm: {part: {k: iv.as_json() for k, iv in vals.items()}
                              for part, vals in t.items()} for arm, t in table.items()},
        "questions": questions,
        "sentences": [cs.sentence(QUESTIONS[q], v["answer"]) for q, v in questions.items()],
    }

