"""The per-run measures and the three questions that the demo's verdict (marble.report.demo_claim)
and the claim experiment (marble.experiments.claim_experiment) both ask (docs/claim.md, issue 26).

Per run (arm x seed): each reward's change, = its held-out mean at the run's last
evaluation minus at step 0 (RUN/eval.jsonl, marble.training.heldout: the EMA weights on the
test split with latents fixed by seed, prompt and repeat; at step 0 every arm of a seed is
the same model on the same prompts and latents, so a change is the training's alone, not a
new draw of prompts or noise); the fraction of diagnostic steps whose applied direction
opposes some reward (`anti_aligned`), split into full-solve and amortized steps, and the
same for a fresh solve on the same gradients (`anti_aligned_solve`), the applied alpha in
the solve's form (`anti_aligned_alpha_unit`) and on raw gradients (`anti_aligned_alpha_raw`).
Over seeds: intervals and paired differences (marble.report.seed_stats). Pure functions on
frames. The experiment's extra per-run measures (levels, dilution) are added by
marble.experiments.claim_experiment.measure_claim_run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from marble.report import seed_stats as cs
from marble.report.seed_stats import json_number

CHANGE_MEASURE = ("held-out mean of the reward over the test prompts it applies to (EMA weights, "
                  "latents fixed by seed, prompt and repeat): last evaluation minus step 0")
# The ranges the fractions and their differences can take: their intervals are cut to them.
FRACTION, FRACTION_DIFFERENCE = (0.0, 1.0), (-1.0, 1.0)
# anti-aligned flags and angles recorded per diagnostic step (marble.balancers.solve);
# ws_direction: the weighted-sum direction on the same batches (the counterfactual baseline)
FLAGS = {"applied": "anti_aligned", "fresh_solve": "anti_aligned_solve",
         "alpha_unit": "anti_aligned_alpha_unit", "alpha_raw": "anti_aligned_alpha_raw",
         "ws_direction": "anti_aligned_ws"}
ANGLES = ("angle_applied_solve", "angle_applied_alpha_raw", "angle_kl")


@dataclass
class RunMeasure:
    arm: str
    seed: int
    changes: dict[str, float]  # reward -> change from the initial model
    anti: dict[str, float]  # FLAGS key (+ "full_solve", "amortized") -> fraction of steps
    angles: dict[str, float]  # ANGLES -> mean degrees over diagnostic steps
    full_solve_min_cos: float  # worst cos_min over full-solve steps (NaN: none)
    full_solve_steps: int
    diag_steps: int = 0  # diagnostic steps the fractions count (their sampling error)
    # filled by the experiment only (marble.experiments.claim_experiment.measure_claim_run)
    levels: dict = field(default_factory=dict)  # claim_levels.run_levels: the three levels
    dilution: dict = field(default_factory=dict)  # reward -> mean `dilution/<reward>` (claim_noise)
    # every measured micro-step (`diag_micro` records, any weight source): the share whose
    # applied direction opposes some reward, and the worst cosine of all (NaN: not logged)
    micro_anti_aligned: float = math.nan
    micro_min_cos: float = math.nan
    # filled by the experiment only (issue 47): the slope of the weighted sum's advantage on the
    # reward's own (`attenuation/<reward>`) and the reward's held-out mean at the last evaluation
    attenuation: dict = field(default_factory=dict)
    final: dict = field(default_factory=dict)


def eval_change(evals: pd.DataFrame | None, reward: str, final_step: int | None = None) -> float:
    """The reward's held-out mean at the last evaluation minus at step 0. NaN when there is no
    step-0 and later evaluation, when the last is not at `final_step` (a run still going),
    when the two measured different things (`eval_id`: test table or settings changed on
    resume), or when the reward was unscorable in either."""
    col = f"eval_reward/{reward}"
    if not has_heldout(evals, final_step) or col not in evals:
        return math.nan
    first, last = float(evals[col].iloc[0]), float(evals[col].iloc[-1])
    return last - first if math.isfinite(first) and math.isfinite(last) else math.nan


def has_heldout(evals: pd.DataFrame | None, final_step: int | None = None) -> bool:
    """A held-out change exists: a step-0 evaluation and a later one (at `final_step` when
    given) of the same evaluation identity."""
    if evals is None or len(evals) < 2 or evals["step"].iloc[0] != 0:
        return False
    if final_step is not None and evals["step"].iloc[-1] != final_step:
        return False
    return "eval_id" not in evals or evals["eval_id"].iloc[0] == evals["eval_id"].iloc[-1]


def _fraction(frame: pd.DataFrame, col: str) -> float:
    if col not in frame:
        return math.nan
    # A line's flag is 0/1 (one micro-step measured) or, since every micro-step of a diagnostic
    # step is measured (issue 36), the fraction of its micro-steps: the mean counts both.
    v = frame[col].to_numpy(dtype=float)
    v = v[np.isfinite(v)]
    return float(np.clip(v, 0.0, 1.0).mean()) if len(v) else math.nan


def measure_run(arm: str, seed: int, metrics: pd.DataFrame, rewards: list[str],
                evals: pd.DataFrame | None, final_step: int | None = None) -> RunMeasure:
    diag = metrics[metrics["anti_aligned"].notna()] if "anti_aligned" in metrics else metrics.iloc[:0]
    solve = diag["full_solve"].fillna(0) > 0 if "full_solve" in diag else pd.Series(False, diag.index)
    anti = {key: _fraction(diag, col) for key, col in FLAGS.items()}
    anti["full_solve"] = _fraction(diag[solve], "anti_aligned")
    anti["amortized"] = _fraction(diag[~solve], "anti_aligned")
    angles = {a: float(diag[a].mean()) if a in diag and diag[a].notna().any() else math.nan
              for a in ANGLES}
    cos = diag.loc[solve, "cos_min"].to_numpy(float) if "cos_min" in diag else np.array([])
    solves = int(solve.sum())
    fresh, other = _micro_minima(diag)
    if fresh is not None:
        # Every micro-step measured (issue 36): a line's cos_min mixes a step's solve with its
        # amortized micro-steps, so the split and the theorem read the per-micro-step records.
        cos, solves = fresh, len(fresh)
        anti["full_solve"] = float((fresh < 0).mean()) if len(fresh) else math.nan
        anti["amortized"] = float((other < 0).mean()) if len(other) else math.nan
    cos = cos[np.isfinite(cos)]
    every = np.concatenate([fresh, other]) if fresh is not None else np.array([])
    return RunMeasure(arm, seed, {r: eval_change(evals, r, final_step) for r in rewards}, anti, angles,
                      float(cos.min()) if len(cos) else math.nan, solves, len(diag), {}, {},
                      float((every < 0).mean()) if len(every) else math.nan,
                      float(every.min()) if len(every) else math.nan)


def _micro_minima(diag: pd.DataFrame) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The finite per-micro-step min cosines of the `diag_micro` records: (fresh solves, the
    rest); (None, None) when the run logged no records (micro-step 0 only)."""
    if "diag_micro" not in diag:
        return None, None
    records = [m for ms in diag["diag_micro"] if isinstance(ms, list) for m in ms]
    if not records:
        return None, None
    cos = [(m.get("source") == "fresh", m.get("cos_min")) for m in records]
    keep = [(f, float(c)) for f, c in cos if c is not None and math.isfinite(float(c))]
    return (np.array([c for f, c in keep if f], float), np.array([c for f, c in keep if not f], float))


def applied_se(m: RunMeasure) -> float:
    return cs.fraction_se(m.anti.get("applied", math.nan), m.diag_steps)


def _fraction_interval(mine: list[RunMeasure], key: str) -> cs.Interval:
    """Interval over seeds of one anti-aligned fraction (a FLAGS key, or the applied direction
    on "full_solve" / "amortized" steps), each run's sampling error over the steps it counts
    as a floor: two seeds at 63% and 63% by chance are not a zero-width interval."""
    def steps(m: RunMeasure) -> int:
        if key == "full_solve":
            return m.full_solve_steps
        return m.diag_steps - m.full_solve_steps if key == "amortized" else m.diag_steps

    floor = cs.pooled_se([cs.fraction_se(m.anti.get(key, math.nan), steps(m)) for m in mine])
    return cs.t_interval([m.anti.get(key, math.nan) for m in mine], sd_floor=floor, bounds=FRACTION)


def _mdd(iv: cs.Interval):
    """The minimal detectable difference at 80% power with these seeds (JSON: null if none)."""
    return json_number(cs.minimal_detectable_difference(iv.sd, iv.n))


def _by_seed(measures: list[RunMeasure], arm: str, get) -> dict[int, float]:
    return {m.seed: get(m) for m in measures if m.arm == arm}


def arm_table(measures: list[RunMeasure], rewards: list[str], baseline: str | None = None) -> dict:
    """arm -> {"change": {reward: Interval}, "anti_aligned": {...}, "angles": {...}} and, with
    a `baseline` arm, "vs_baseline": {reward: the arm's change minus the baseline's, paired by
    seed} for every other arm (the zoo's arms beside MARBLE's, with the same intervals)."""
    out = {}
    for arm in dict.fromkeys(m.arm for m in measures):
        mine = [m for m in measures if m.arm == arm]
        out[arm] = {
            "change": {r: cs.t_interval([m.changes[r] for m in mine]) for r in rewards},
            "anti_aligned": {k: _fraction_interval(mine, k) for k in [*FLAGS, "full_solve", "amortized"]},
            "angles": {a: cs.t_interval([m.angles[a] for m in mine]) for a in ANGLES},
        }
        if baseline is not None and arm != baseline:
            out[arm]["vs_baseline"] = {
                r: cs.paired(_by_seed(measures, arm, lambda m: m.changes[r]),
                             _by_seed(measures, baseline, lambda m: m.changes[r])) for r in rewards}
    return out


def question_a(measures, rewards, marble_arm) -> dict:
    per, mdd = {}, {}
    for r in rewards:
        iv = cs.t_interval(_by_seed(measures, marble_arm, lambda m: m.changes[r]).values())
        per[r] = cs.decide(iv)
        mdd[r] = _mdd(iv)
    return {"answer": cs.all_of(list(per.values())), "per_reward": per,
            "minimal_detectable_difference": mdd}


def power_fields(iv: cs.Interval, effect: float) -> dict:
    """The minimal detectable difference of these seeds, the smallest effect of interest
    (fixed before the run, docs/claim.md), whether the seeds detect it (MDD <= effect) and
    how many would, and how many would detect the observed difference."""
    mdd = cs.minimal_detectable_difference(iv.sd, iv.n)
    return {"minimal_detectable_difference": json_number(mdd),
            "effect_of_interest": json_number(effect),
            "powered": bool(math.isfinite(effect) and mdd <= abs(effect)),
            "seeds_for_effect_of_interest": cs.seeds_needed(iv.sd, effect),
            "seeds_for_observed_effect": cs.seeds_needed(iv.sd, iv.mean)}


def question_b(measures, specialists, marble_arm, baseline_arm, effects: dict[str, float]) -> dict:
    """Per specialist, MARBLE's change minus the weighted sum's, paired by seed; `effects`:
    reward -> the smallest difference of interest."""
    per = {}
    for s in specialists:
        iv = cs.paired(_by_seed(measures, marble_arm, lambda m: m.changes[s]),
                       _by_seed(measures, baseline_arm, lambda m: m.changes[s]))
        per[s] = {"difference": iv.as_json(), "answer": cs.decide(iv),
                  **power_fields(iv, effects.get(s, math.nan))}
    return {"answer": cs.all_of([p["answer"] for p in per.values()]), "per_specialist": per}


def question_c(measures, marble_arm, baseline_arm, effect: float = math.nan) -> dict:
    """The weighted sum's anti-aligned fraction minus MARBLE's, paired by seed (> 0: MARBLE
    opposes a reward less often); each run's fraction carries its sampling error as a floor."""
    base = _by_seed(measures, baseline_arm, lambda m: m.anti["applied"])
    marble = _by_seed(measures, marble_arm, lambda m: m.anti["applied"])
    se = {arm: _by_seed(measures, arm, applied_se) for arm in (baseline_arm, marble_arm)}
    floor = cs.pooled_se([math.hypot(se[baseline_arm][s], se[marble_arm][s])
                          for s in sorted(set(base) & set(marble))])
    iv = cs.paired(base, marble, sd_floor=floor, bounds=FRACTION_DIFFERENCE)
    return {"answer": cs.decide(iv), "difference": iv.as_json(), **power_fields(iv, effect)}


QUESTIONS = {
    "every_reward_learnable_alone": "Each reward rises when trained alone",
    "a_every_reward_rises_under_marble": "(a) Every reward rises under MARBLE",
    "b_specialists_rise_more_under_marble":
        "(b) Every specialist rises more under MARBLE than under the weighted sum (paired by seed)",
    "c_marble_less_anti_aligned":
        "(c) MARBLE's applied direction opposes some reward on fewer steps than the weighted sum's",
    "conflict_weighted_sum_anti_aligned":
        "The rewards conflict: the weighted sum's direction opposes some reward on a fraction of steps above 0",
    "theorem_full_solves_never_anti_aligned":
        "Every full-solve step's combination has worst-reward cosine >= -1e-6",
}
