"""`python -m marble.experiments.claim_pilot`: a committed pilot from a claim run (issue 36 item 4).

    python -m marble.experiments.claim_pilot --runs results/claim/runs --commit <sha of the run's code>
        --out docs/claim_pilot.json

A pilot fixes, before the main run, each question's seed-to-seed spread and its effect of
interest, so "powered" is not decided from the data it judges (claim_design.pilot_section
reads the file). Per arm beside the baseline, the per-seed values the questions test:

- `a_every_reward_rises_under_<arm>`: item = reward, the arm's change per seed; effect: the
  reward's alone effect where it has one (else NaN: (a) asks for a rise, of any size);
- `b_specialists_rise_more_under_<arm>`: item = specialist, the arm's change minus the
  baseline's per seed; effect: `effect_fraction` x the specialist's change trained alone;
- `c_<arm>_less_anti_aligned`: item `anti_aligned`, the baseline's applied anti-aligned
  fraction minus the arm's per seed; effect: `effect_fraction` x the paper's 80% - 0%.

The main run then uses fresh seeds (config.yaml `claim.seeds`), never the pilot's.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from marble.experiments.claim_cli import collect
from marble.experiments.claim_experiment import effects_of_interest
from marble.experiments.claim_rule import AMENDMENT, DECISION_RULES
from marble.experiments.claim_toy_check import b_conditions
from marble.report.run_measures import RunMeasure
from marble.report.loading import ReportInputError
from marble.report.published import PUBLISHED_ANTI_ALIGNED
from marble.runtime.io import write_json
from marble.workflow.claim import ALONE_PREFIX, CONTROL_PREFIX

__all__ = ["pilot_from_measures"]


def _per_seed(measures: list[RunMeasure], arm: str, get) -> dict[int, float]:
    return {m.seed: get(m) for m in measures if m.arm == arm}


def _paired(a: dict[int, float], b: dict[int, float]) -> list[float]:
    return [a[s] - b[s] for s in sorted(set(a) & set(b))]


def _clean(values: list[float]) -> list[float | None]:
    return [v if math.isfinite(v) else None for v in values]


def pilot_from_measures(measures: list[RunMeasure], rewards: list[str], specialists: dict[str, float],
                        baseline: str, effect_fraction: float, commit: str) -> dict:
    """The pilot file's content (format: docs/claim.md, claim_design.load_pilot)."""
    alone = [m for m in measures if m.arm.startswith(ALONE_PREFIX)]
    main = [m for m in measures if not m.arm.startswith(ALONE_PREFIX)]
    effects = effects_of_interest(alone, effect_fraction)
    effect_c = effect_fraction * (PUBLISHED_ANTI_ALIGNED["weighted_sum"] - PUBLISHED_ANTI_ALIGNED["marble"])
    questions = {}
    for arm in dict.fromkeys(m.arm for m in main):
        if arm == baseline:
            continue
        questions[f"a_every_reward_rises_under_{arm}"] = {
            r: {"per_seed": _clean(list(_per_seed(main, arm, lambda m, r=r: m.changes[r]).values())),
                "effect_of_interest": effects.get(r, math.nan)} for r in rewards}
        questions[f"b_specialists_rise_more_under_{arm}"] = {
            s: {"per_seed": _clean(_paired(_per_seed(main, arm, lambda m, s=s: m.changes[s]),
                                           _per_seed(main, baseline, lambda m, s=s: m.changes[s]))),
                "effect_of_interest": effects.get(s, math.nan)} for s in specialists}
        questions[f"c_{arm}_less_anti_aligned"] = {"anti_aligned": {
            "per_seed": _clean(_paired(_per_seed(main, baseline, lambda m: m.anti["applied"]),
                                       _per_seed(main, arm, lambda m: m.anti["applied"]))),
            "effect_of_interest": effect_c}}
    return {"commit": commit, "seeds": sorted({m.seed for m in main}), "baseline_arm": baseline,
            "effect_fraction": effect_fraction, "questions": questions,
            # issue 47: whether the toy can decide (b), and the rules, fixed before the main run
            "b_decidable": b_conditions(measures, specialists, baseline),
            "decision_rules": DECISION_RULES, "decision_rules_amendment": AMENDMENT}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m marble.experiments.claim_pilot", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=Path, required=True, help="the pilot's results/claim/runs")
    p.add_argument("--commit", required=True, help="the commit whose code made the runs")
    p.add_argument("--baseline-arm", default="weighted_sum")
    p.add_argument("--effect-fraction", type=float, default=0.5)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--main-seeds", default="", help="the main run's seeds, comma-separated (fresh: "
                   "none of the pilot's); recorded in the file before the main run")
    p.add_argument("--run-tree", default=None, help="the tree the runs trained from when it was "
                   "not a commit (git stash create), recorded beside --commit")
    args = p.parse_args(argv)
    try:
        measures, rewards, specialists, *_ = collect(args.runs, None)
    except (ReportInputError, ValueError) as exc:
        print(f"claim_pilot: error: {exc}", file=sys.stderr)
        return 2
    measures = [m for m in measures if not m.arm.startswith(CONTROL_PREFIX)]  # other rewards
    pilot = pilot_from_measures(measures, rewards, specialists, args.baseline_arm, args.effect_fraction,
                                args.commit)
    main_seeds = [int(x) for x in args.main_seeds.split(",") if x.strip()]
    if set(main_seeds) & set(pilot["seeds"]):
        print(f"claim_pilot: error: --main-seeds reuse pilot seeds {sorted(set(main_seeds) & set(pilot['seeds']))}",
              file=sys.stderr)
        return 2
    pilot["main_run_seeds"] = main_seeds
    if args.run_tree:
        pilot["run_tree"] = args.run_tree
    write_json(args.out, pilot)
    print(f"{args.out}: {len(pilot['questions'])} questions from seeds {pilot['seeds']} (commit {args.commit})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
