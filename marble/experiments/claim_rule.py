"""One decision rule for every question of the claim's verdict (issue 47 item 4).

Every answer is its Holm-adjusted two-sided t-test at alpha = 1 - LEVEL within the question's
family (FAMILIES says which): True / False when the adjusted p is below alpha (the sign of the
mean), else "no difference shown after Holm adjustment (p = x)". The intervals stay in the
verdict as figures; they decide nothing. Why one rule: with intervals deciding and Holm beside
them, text contrast passed the learnability gate only unadjusted (Holm p 0.06), two rules for
one question. A family of one is its own test, so for (c) and the conflict the answer is the
interval's (p < alpha iff the 95% interval, with the same sd floor, excludes 0).

Equivalence is never read from an undecided answer: only (b)'s TOST (claim_design) says it.
Replication: a question is "replicated" only when both seed halves decide it the same way
(both true or both false); both undecided is "undecided in the halves", said as such; any other
pair is "not replicated".

Pure functions on per-seed numbers (tests/test_claim_rule.py by hand).
"""

from __future__ import annotations

import math

from scipy import stats

from marble.experiments import claim_family as fam
from marble.report.seed_stats import finite, json_number

__all__ = ["FAMILIES", "SECTION_FAMILIES", "AMENDMENT", "t_pvalue_floor", "holm_family", "decide_family",
           "every", "apply_rule", "replication_status",
           "overall_replication", "DECISION_RULES", "REPLICATED", "UNDECIDED", "NOT_REPLICATED"]

# question -> its Holm family, in the verdict's words
FAMILIES = {
    "every_reward_learnable_alone": "the rewards, each trained alone (one test per reward)",
    "a_every_reward_rises_under_marble": "the rewards under the MARBLE arm (one test per reward)",
    "b_specialists_rise_more_under_marble":
        "the specialists, MARBLE minus the weighted sum paired by seed (one test per specialist)",
    "c_marble_less_anti_aligned": "itself (one test: the applied anti-aligned fraction's difference)",
    "conflict_weighted_sum_anti_aligned": "itself (one test: the weighted sum's anti-aligned fraction)",
    "theorem_full_solves_never_anti_aligned": "none: a bound checked on every full solve, not a test",
}

# The verdict's sections beside the questions, one family each (decide_family): added after the
# pilot and before the main run (AMENDMENT); until then they were decided by interval.
SECTION_FAMILIES = {
    "noise.sweep": "every swept arm at every level (one test each: the smallest micro-batch's "
                   "anti-aligned fraction minus the largest's, paired by seed)",
    "noise.control": "every control arm at every level (one test each: the arm's anti-aligned "
                     "fraction minus its control's, paired by seed)",
    "levels": "every figure of every level of every arm with a published row (one test each: "
              "ours minus the paper's, over seeds)",
    "arms_versus_baseline": "per arm, (a) the rewards under it, (b) the specialists against the "
                            "weighted sum, (c) itself, as the verdict's questions; 'versus' the "
                            "rewards' changes against each reference arm, paired by seed",
}

REPLICATED, UNDECIDED, NOT_REPLICATED = "replicated", "undecided in the halves", "not replicated"

# The rules as the pilot file states them before the main run (docs/claim_pilot.json)
DECISION_RULES = {
    "answers": "every question's answer is its two-sided one-sample t-test over seeds (paired by "
               "seed for a difference of arms), Holm-adjusted within the question's family at "
               "alpha 0.05: true / false by the mean's sign when the adjusted p < 0.05, else "
               "'no difference shown after Holm adjustment'; intervals are figures, not answers",
    "families": FAMILIES,
    "equivalence": "claimed only by (b)'s TOST against its effect of interest, Holm-adjusted over "
                   "the specialists; an undecided answer is never a match",
    "replication": "the seeds' two sorted halves each answer every question by the same rule: "
                   "'replicated' only when both decide it the same way, 'undecided in the halves' "
                   "when neither decides, else 'not replicated'",
    "effects_of_interest": "(b): 0.5 x the specialist's mean gain trained alone in this pilot; "
                           "(c): 0.5 x the paper's 80% - 0% anti-aligned gap",
    "b_decidable": "a specialist rises alone in both seed halves, has room above it and is "
                   "attenuated (0 < slope < 1), not opposed, in the weighted sum's combined "
                   "advantage (marble.experiments.claim_toy_check)",
}


# What changed in the rules after the pilot file, before any main-run data (docs/claim.md,
# "Pre-registration"); the pilot file states it beside its own rules.
AMENDMENT = {
    "families": SECTION_FAMILIES,
    "why": "issue 47 item 4 asks every answer from its Holm-adjusted test; the sweep, the control, "
           "the levels and the arms beside the baseline were still decided by their intervals",
    "versus": "each arm beside the baseline is also compared, reward by reward, with the weighted "
              "sum and with the MARBLE arm (issue 47 item 2: does the exact balance change (a) and "
              "(b) against both)",
    "effects_of_interest": "the arms beside the baseline take (b)'s effects of interest from the "
                           "pilot too, as the MARBLE arm does",
}


def t_pvalue_floor(values, sd_floor: float = 0.0) -> float:
    """Two-sided one-sample t-test p of mean = 0, the sample sd raised to `sd_floor` as
    seed_stats.t_interval raises it (so p < alpha exactly when that interval excludes 0).
    NaN below two finite values or for a zero spread at mean 0; 0 for a zero spread otherwise."""
    xs = finite(values)
    if len(xs) < 2:
        return math.nan
    n, mean = len(xs), sum(xs) / len(xs)
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    if math.isfinite(sd_floor):
        sd = max(sd, sd_floor)
    if sd == 0:
        return math.nan if mean == 0 else 0.0
    return float(2 * stats.t.sf(abs(mean) / (sd / math.sqrt(n)), n - 1))


def holm_family(values: dict[str, list], floors: dict[str, float] | None = None) -> dict:
    """member -> {"mean", "p", "p_holm", "answer"}: each member's test, Holm-adjusted over the
    members with a p (a member without one stays undecided and does not count in m)."""
    p = {name: t_pvalue_floor(v, (floors or {}).get(name, 0.0)) for name, v in values.items()}
    adj = fam.holm(p)
    out = {}
    for name, v in values.items():
        xs = finite(v)
        mean = sum(xs) / len(xs) if xs else math.nan
        out[name] = {"mean": json_number(mean), "p": json_number(p[name]),
                     "p_holm": json_number(adj[name]), "answer": fam.adjusted_answer(mean, adj[name])}
    return out


def decide_family(entries: dict, family: str) -> None:
    """The rule for a verdict section: each entry (a dict holding its `per_seed` values) gets
    its `p`, `p_holm`, `answer` and the `family` sentence, Holm-adjusted over every entry (one
    without values stays undecided, outside m)."""
    members = holm_family({key: entry["per_seed"] for key, entry in entries.items()})
    for key, member in members.items():
        entries[key].update(p=member["p"], p_holm=member["p_holm"], answer=member["answer"], family=family)


def every(answers: list):
    """A question over its family: False when any member is False, True when all are True,
    else undecided (which members: the question's `holm.members`)."""
    if len(answers) == 1:  # a family of one: its member's own answer, p included
        return answers[0]
    if any(a is False for a in answers):
        return False
    if answers and all(a is True for a in answers):
        return True
    return "no difference shown after Holm adjustment (some member undecided)"


def replication_status(first, second) -> str:
    """Two halves' answers to one question: replicated only when both decide the same way."""
    kinds = fam.answer_kind(first), fam.answer_kind(second)
    if kinds[0] == kinds[1]:
        return UNDECIDED if kinds[0] == "no difference shown" else REPLICATED
    return NOT_REPLICATED


def overall_replication(statuses: list[str]) -> str:
    """The verdict's one word: not replicated if any question is; replicated if every one is;
    else undecided in the halves (no question contradicted, some not decided in both)."""
    if NOT_REPLICATED in statuses:
        return NOT_REPLICATED
    return REPLICATED if statuses and all(s == REPLICATED for s in statuses) else UNDECIDED


def apply_rule(questions: dict, values: dict[str, dict[str, list]],
               floors: dict[str, dict[str, float]] | None = None) -> dict:
    """`questions` (the verdict's) with every answer, and every member's, from its Holm family:
    `values`: question -> member -> per-seed values; `floors`: question -> member -> sd floor.
    Each question gains `holm`: {"family": FAMILIES[q], "members": holm_family(...)}."""
    for q, spec in questions.items():
        if q not in values:  # the theorem: a bound on every solve, no test (FAMILIES)
            continue
        members = holm_family(values[q], (floors or {}).get(q))
        spec["holm"] = {"family": FAMILIES.get(q, "its members"), "members": members}
        spec["answer"] = every([m["answer"] for m in members.values()])
        per = spec.get("per_reward") or spec.get("per_specialist") or {}
        for name in per:  # a member's own answer: the same rule
            if isinstance(per[name], dict):
                per[name]["answer"] = members[name]["answer"]
            else:
                per[name] = members[name]["answer"]
    return questions
