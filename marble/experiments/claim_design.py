"""The verdict's `multiplicity`, `replication` and `pilot` keys (issue 36 item 4).

- multiplicity: a question asked of several rewards or arms is a family; each member's
  two-sided t-test p over seeds is Holm-adjusted within its family (the claim's (a) over
  rewards, (b) over specialists, learnability over rewards; the zoo's every arm x reward
  against the baseline), and (b)'s equivalence is the TOST against its effect of interest,
  Holm-adjusted too: "equivalent" only when that test says so, never from an interval that
  overlaps 0.
- replication: the verdict on two disjoint halves of the seeds; a question is "replicated"
  only when both halves decide it the same way, "undecided in the halves" when neither
  decides, else "not replicated" (claim_rule; too few seeds for a test in each half: "not
  computable").
- pilot: a committed file (docs/claim_pilot.json, format in docs/claim.md) fixes each
  question's seed spread before the main run; without one the verdict says "no pilot" and
  `powered` stays the observed-sd figure it is labelled as.

Pure functions on RunMeasure lists (tests/test_claim_design.py by hand).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from marble.experiments import claim_family as fam
from marble.report import seed_stats as cs
from marble.experiments.claim_experiment import claim_verdict, effects_of_interest
from marble.experiments.claim_rule import (NOT_REPLICATED, REPLICATED, UNDECIDED, overall_replication,
                                           replication_status)
from marble.workflow.claim import ALONE_PREFIX

__all__ = ["multiplicity", "replication", "load_pilot", "pilot_section", "NO_PILOT"]

NO_PILOT = "no pilot"


def _family(values: dict[str, list[float]]) -> dict:
    """name -> per-seed values: p, Holm-adjusted p and the adjusted answer per member."""
    p = {name: fam.t_pvalue(v) for name, v in values.items()}
    adj = fam.holm(p)
    out = {}
    for name, v in values.items():
        mean = cs.t_interval(v).mean
        out[name] = {"p": cs.json_number(p[name]), "p_holm": cs.json_number(adj[name]),
                     "answer": fam.adjusted_answer(mean, adj[name])}
    return out


def _by_seed(measures, arm: str, get) -> dict[int, float]:
    return {m.seed: get(m) for m in measures if m.arm == arm}


def paired_changes(measures, arm: str, base: str, reward: str) -> list[float]:
    """The arm's change of `reward` minus the base arm's, per seed both ran (seed order)."""
    a = _by_seed(measures, arm, lambda m: m.changes.get(reward, math.nan))
    b = _by_seed(measures, base, lambda m: m.changes.get(reward, math.nan))
    return [a[s] - b[s] for s in sorted(set(a) & set(b))]


def multiplicity(measures, rewards, specialists, marble_arm, baseline_arm,
                 effect_fraction: float = 0.5, fixed_effects: dict[str, float] | None = None) -> dict:
    """Holm families (see the module docstring) and (b)'s equivalence tests, whose margins are
    the pilot's effects of interest when given (`fixed_effects`), else this run's alone arms'."""
    alone = [m for m in measures if m.arm.startswith(ALONE_PREFIX)]
    main = [m for m in measures if not m.arm.startswith(ALONE_PREFIX)]
    families = {
        "a_every_reward_rises_under_marble": _family(
            {r: list(_by_seed(main, marble_arm, lambda m: m.changes.get(r, math.nan)).values())
             for r in rewards}),
        "b_specialists_rise_more_under_marble": _family(
            {s: paired_changes(main, marble_arm, baseline_arm, s) for s in specialists}),
    }
    if alone:
        families["every_reward_learnable_alone"] = _family(
            {m.arm[len(ALONE_PREFIX):]: [x.changes.get(x.arm[len(ALONE_PREFIX):], math.nan)
                                         for x in alone if x.arm == m.arm] for m in alone})
    others = [a for a in dict.fromkeys(m.arm for m in main) if a not in (baseline_arm,)]
    if len(others) > 1:  # the zoo: every arm x reward against the baseline is one family
        families["arms_vs_baseline"] = _family(
            {f"{a}/{r}": paired_changes(main, a, baseline_arm, r) for a in others for r in rewards})
    effects = fixed_effects or effects_of_interest(alone, effect_fraction)
    tost_p = {s: fam.tost(paired_changes(main, marble_arm, baseline_arm, s), effects.get(s, math.nan))
              for s in specialists}
    tost_adj = fam.holm(tost_p)
    equivalence = {s: {"margin": cs.json_number(effects.get(s, math.nan)),
                       "p_tost": cs.json_number(tost_p[s]), "p_holm": cs.json_number(tost_adj[s]),
                       "equivalent": bool(math.isfinite(tost_adj[s]) and tost_adj[s] < 1 - cs.LEVEL)}
                   for s in specialists}
    return {"method": "holm", "alpha": 1 - cs.LEVEL, "families": families,
            "b_equivalence": equivalence,
            "note": "equivalence is claimed only where the TOST says so; an interval that "
                    "contains 0 is not a match"}


def replication(measures, rewards, specialists, marble_arm, baseline_arm, seeds: list | None = None,
                **kwargs) -> dict:
    """The verdict on each half of the claim arms' seeds (fam.halves) and, per question, whether
    the two answers say the same (true / false / no difference shown). The alone arms (their own
    seeds, often fewer) are not split: both halves read all of them for the effects of
    interest, so learnability is not a question the halves replicate."""
    alone = [m for m in measures if m.arm.startswith(ALONE_PREFIX)]
    main = [m for m in measures if not m.arm.startswith(ALONE_PREFIX)]
    first, second = fam.halves(seeds if seeds is not None else sorted({m.seed for m in main}))
    if len(first) < 2:
        return {"status": "not computable", "seed_sets": [first, second],
                "why": "each half needs two seeds for an interval"}
    verdicts = [claim_verdict([m for m in main if m.seed in half] + alone, rewards, specialists,
                              marble_arm, baseline_arm, **kwargs) for half in (first, second)]
    questions = {}
    for q in verdicts[0]["questions"]:
        answers = [v["questions"].get(q, {}).get("answer") for v in verdicts]
        if q == "every_reward_learnable_alone":
            questions[q] = {"answers": answers, "status": "not split (the alone arms are shared)"}
            continue
        # issue 47: two undecided halves are no agreement: "undecided in the halves"
        questions[q] = {"answers": answers, "status": replication_status(*answers)}
    status = overall_replication([q["status"] for q in questions.values()
                                  if q["status"] in (REPLICATED, UNDECIDED, NOT_REPLICATED)])
    return {"status": status, "seed_sets": [first, second], "questions": questions,
            "rule": "replicated only when both halves decide a question the same way (both true "
                    "or both false); both undecided: undecided in the halves; else not replicated"}


def load_pilot(path: Path | None) -> dict | None:
    """The committed pilot ({"commit", "seeds", "questions": {question: {item: {"per_seed":
    [...], "effect_of_interest": x}}}}), or None when there is no file. A bad file is one
    error naming it."""
    if path is None or not Path(path).is_file():
        return None
    try:
        pilot = json.loads(Path(path).read_text(encoding="utf-8"))
        if not isinstance(pilot.get("commit"), str) or not isinstance(pilot.get("questions"), dict):
            raise ValueError("needs a 'commit' string and a 'questions' object")
    except (ValueError, AttributeError) as exc:
        raise ValueError(f"{path}: not a claim pilot: {exc}") from None
    # strict JSON writes an undefined figure (NaN) as null: read back as NaN, here once
    return {**pilot, "questions": fam.null_as_nan(pilot["questions"])}


def pilot_effects(pilot: dict | None, marble_arm: str) -> dict[str, float] | None:
    """specialist -> (b)'s effect of interest (absolute units) the pilot fixed for `marble_arm`
    (its question `b_specialists_rise_more_under_<arm>`), or None: no pilot, or none for it."""
    if pilot is None:
        return None
    items = pilot["questions"].get(f"b_specialists_rise_more_under_{marble_arm}") or {}
    effects = {s: float(spec["effect_of_interest"]) for s, spec in items.items()
               if isinstance(spec, dict) and isinstance(spec.get("effect_of_interest"), (int, float))
               and math.isfinite(spec["effect_of_interest"])}
    return effects or None


def pilot_section(pilot: dict | None, seeds: int) -> dict | str:
    """Per question and item, the power the pilot fixes for `seeds` seeds, or "no pilot"."""
    if pilot is None:
        return NO_PILOT
    out = {"commit": pilot["commit"], "design_seeds": seeds, "questions": {}}
    for q, items in pilot["questions"].items():
        out["questions"][q] = {item: fam.pilot_powered(spec.get("per_seed", []), seeds,
                                                      float(spec.get("effect_of_interest", math.nan)))
                               for item, spec in items.items()}
    return out
