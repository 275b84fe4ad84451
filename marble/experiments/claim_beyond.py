"""The verdict's `arms_versus_baseline` (issue 37): the question beyond the paper, asked of
every arm beside the baseline.

Does the arm's applied direction keep every reward's cosine positive on every measured
micro-step (the paper's "consistently positive" worst cosine, read where it can fail: each
micro-step's own direction, whatever solve its weights came from), at the weighted sum's
cost (its counted FLOPs without diagnostics, `cost.json` `plain`, within 1%), and does it keep
(a) every reward rises and (b) the specialists rise more than under the weighted sum? (c)
(less often anti-aligned than the weighted sum, on the applied steps) is given beside them.
(a), (b) and (c) are the verdict's questions with the arm in MARBLE's place, answered by the
same rule (claim_rule: Holm within each family). `versus` (issue 47 item 2): does the arm change
any reward's held-out gain against each reference arm (the weighted sum, amortized MARBLE),
paired by seed and Holm-adjusted over the rewards.
"""

from __future__ import annotations

import math

from marble.experiments.claim_design import paired_changes
from marble.experiments.claim_experiment import effects_of_interest, rule_values
from marble.experiments.claim_noise import control_section, sweep_section
from marble.experiments.claim_rule import SECTION_FAMILIES, apply_rule, holm_family
from marble.report.published import PUBLISHED_ANTI_ALIGNED
from marble.report import seed_stats as cs
from marble.report.run_measures import RunMeasure, question_a, question_b, question_c
from marble.report.seed_stats import json_number
from marble.workflow.claim import ALONE_PREFIX

__all__ = ["AT_COST", "arms_versus_baseline", "beside_questions"]

AT_COST = 1.01  # "at the weighted sum's cost": counted FLOPs within 1% (issue 37)


def _one_arm(measures: list[RunMeasure], arm: str, baseline: str, rewards: list[str],
             specialists: dict[str, float], effects: dict[str, float], effect_c: float,
             ratio: float | None) -> dict:
    mine = [m for m in measures if m.arm == arm]
    worst = [m.micro_min_cos for m in mine if math.isfinite(m.micro_min_cos)]
    measured = bool(worst) and len(worst) == len(mine)
    positive = measured and min(worst) >= 0.0
    questions = {"a_every_reward_rises_under_marble": question_a(measures, rewards, arm),
                 "b_specialists_rise_more_under_marble": question_b(measures, specialists, arm, baseline, effects),
                 "c_marble_less_anti_aligned": question_c(measures, arm, baseline, effect_c)}
    apply_rule(questions, *rule_values(measures, [], rewards, specialists, arm, baseline))
    a, b = (questions[q]["answer"] for q in ("a_every_reward_rises_under_marble",
                                             "b_specialists_rise_more_under_marble"))
    c = questions["c_marble_less_anti_aligned"]
    at_cost = ratio is not None and math.isfinite(ratio) and ratio <= AT_COST
    answer = positive and at_cost and a is True and b is True
    return {
        "micro_anti_aligned": cs.t_interval([m.micro_anti_aligned for m in mine], bounds=(0.0, 1.0)).as_json(),
        "worst_micro_cosine": json_number(min(worst)) if worst else None,
        "positive_every_micro_step": positive if measured else "not measured (no per-micro-step records)",
        "flops_ratio_without_diagnostics": json_number(ratio) if ratio is not None else None,
        "at_weighted_sum_cost": at_cost,
        "a_every_reward_rises": a, "b_specialists_rise_more": b,
        "c_less_anti_aligned": c["answer"], "c_difference": c["difference"],
        "answer": answer, "family": SECTION_FAMILIES["arms_versus_baseline"],
    }


def change_versus(measures: list[RunMeasure], arm: str, reference: str, rewards: list[str]) -> dict:
    """reward -> the arm's held-out change minus the reference arm's, paired by seed: mean, p,
    Holm p over the rewards and the answer (true: the arm gains more)."""
    return holm_family({r: paired_changes(measures, arm, reference, r) for r in rewards})


def arms_versus_baseline(measures: list[RunMeasure], arms: list[str], baseline: str, rewards: list[str],
                         specialists: dict[str, float], effects: dict[str, float], effect_c: float,
                         costs: dict, marble_arm: str | None = None) -> dict:
    """arm -> the question's parts and `answer` (true only when all four hold), for every arm
    but the baseline, and `versus`: reference arm (the baseline, `marble_arm`) -> change_versus;
    `costs`: claim_cost's cost.json (arm -> {"plain": {"ratio"}})."""
    out = {}
    for arm in arms:
        if arm == baseline:
            continue
        ratio = ((costs.get(arm) or {}).get("plain") or {}).get("ratio")
        out[arm] = _one_arm(measures, arm, baseline, rewards, specialists, effects, effect_c, ratio)
        out[arm]["versus"] = {ref: change_versus(measures, arm, ref, rewards)
                              for ref in dict.fromkeys((baseline, marble_arm)) if ref and ref != arm}
    return out


def _pct(x) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{100 * x:.0f}%"


def beyond_sentence(arm: str, part: dict) -> str:
    """One sentence per arm, in the answers' words."""
    micro, worst, ratio = part["micro_anti_aligned"], part["worst_micro_cosine"], \
        part["flops_ratio_without_diagnostics"]
    positive = part["positive_every_micro_step"]
    return (f"Beyond the paper, `{arm}`: worst cosine "
            f"{'positive' if positive is True else 'not positive' if positive is False else positive} "
            f"on every measured micro-step (worst {'n/a' if worst is None else f'{worst:+.3f}'}; "
            f"anti-aligned on {_pct(micro['mean'])} of micro-steps, [{_pct(micro['low'])}, {_pct(micro['high'])}]), "
            f"{'at' if part['at_weighted_sum_cost'] else 'not at'} the weighted sum's cost "
            f"(x{'n/a' if ratio is None else f'{ratio:.4f}'} without diagnostics); (a) "
            f"{part['a_every_reward_rises']}, (b) {part['b_specialists_rise_more']}: "
            f"{'yes' if part['answer'] else 'no'}.")


def beside_questions(measures: list[RunMeasure], control: list[RunMeasure], rewards: list[str],
                     specialists: dict[str, float], marble_arm: str, baseline_arm: str,
                     micro_batch: dict[str, int], costs: dict, fixed_effects: dict[str, float] | None,
                     effect_fraction: float = 0.5) -> dict:
    """The verdict's sections beside its questions, each decided by its Holm family
    (claim_rule.SECTION_FAMILIES): `noise` (the micro-batch sweep, the no-conflict control) and
    `arms_versus_baseline` (issue 37's question of every arm beside the baseline, with its
    `versus`). One function for claim_cli and for the per-seed recomputation (claim_per_seed)."""
    alone = [m for m in measures if m.arm.startswith(ALONE_PREFIX)]
    trained = [m for m in measures if not m.arm.startswith(ALONE_PREFIX)]
    arms = list(dict.fromkeys(m.arm for m in trained))
    gap = PUBLISHED_ANTI_ALIGNED["weighted_sum"] - PUBLISHED_ANTI_ALIGNED["marble"]
    return {"noise": {"sweep": sweep_section(trained, micro_batch), "control": control_section(control, trained)},
            "arms_versus_baseline": arms_versus_baseline(
                trained, arms, baseline_arm, rewards, specialists,
                fixed_effects or effects_of_interest(alone, effect_fraction), effect_fraction * gap,
                costs, marble_arm)}
