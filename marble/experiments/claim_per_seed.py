"""The claim's per-seed file and its recomputation (issue 47 item 3).

    python -m marble.experiments.claim_per_seed FILE

(a script, not `marble report claim`: no product module imports the experiments,
tests/test_import_graph.py)

`marble report claim` (claim_cli) writes OUT/per_seed.json beside the verdict: every run's
measures (arm, seed, changes, anti-aligned fractions, levels, dilution, attenuation, ...) and
the settings the verdict was computed with. Committed beside docs/claim.md, it lets a reader
recompute every headline figure of the verdict from the repository: this module loads it and
prints the headline (each question's answer, Holm family p and interval, the halves' word)
as JSON, exactly as claim_cli computed it (tests/test_claim_per_seed.py checks the equality).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from marble.experiments.claim_beyond import beside_questions
from marble.experiments.claim_design import multiplicity, replication
from marble.experiments.claim_family import null_as_nan
from marble.experiments.claim_experiment import claim_verdict
from marble.experiments.claim_markdown import headline_markdown
from marble.report.run_measures import RunMeasure
from marble.runtime.io import finite_or_null, write_json
from marble.workflow.claim import CONTROL_PREFIX

FORMAT = "marble claim per-seed 1"
SETTINGS = ("marble_arm", "baseline_arm", "effect_fraction", "min_norm_arms", "arm_methods", "fixed_effects",
            "micro_batch", "costs")


def per_seed_record(measures: list[RunMeasure], rewards: list[str], specialists: dict, **settings) -> dict:
    """The file's content: FORMAT, the verdict's settings (SETTINGS), rewards, specialists, runs."""
    return finite_or_null({"format": FORMAT, "rewards": rewards, "specialists": specialists,
                    **{k: settings.get(k) for k in SETTINGS},
                    "runs": [dataclasses.asdict(m) for m in measures]})


def load_per_seed(record: dict) -> tuple[list[RunMeasure], dict]:
    """(measures, the record) of a per-seed file's content; ValueError on another format."""
    if record.get("format") != FORMAT:
        raise ValueError(f"not a claim per-seed file (format {record.get('format')!r}, want {FORMAT!r})")
    measures = []
    for run in record["runs"]:
        fields = {k: (null_as_nan(v) if k not in ("arm", "seed", "full_solve_steps", "diag_steps") else v)
                  for k, v in run.items()}
        measures.append(RunMeasure(**fields))
    return measures, record


def headline(record: dict) -> dict:
    """The verdict's headline figures recomputed from the per-seed record: each question's
    answer and its figures, the Holm families and the halves' word; the levels, and the
    sections beside the questions (the sweep, the control, every arm beside the baseline) when
    the record has their settings (`micro_batch`, `costs`; files before issue 47's main run
    lack them)."""
    measures, r = load_per_seed(record)
    main = [m for m in measures if not m.arm.startswith(CONTROL_PREFIX)]
    control = [m for m in measures if m.arm.startswith(CONTROL_PREFIX)]
    # the file's nulls are the verdict's NaN (an effect of interest the pilot could not fix)
    fixed = null_as_nan(r["fixed_effects"]) if r.get("fixed_effects") is not None else None
    kw = {"effect_fraction": r["effect_fraction"], "min_norm_arms": r.get("min_norm_arms"),
          "arm_methods": r.get("arm_methods"), "fixed_effects": fixed}
    v = claim_verdict(main, r["rewards"], r["specialists"], r["marble_arm"], r["baseline_arm"], **kw)
    halves = replication(main, r["rewards"], r["specialists"], r["marble_arm"], r["baseline_arm"], **kw)
    mult = multiplicity(main, r["rewards"], r["specialists"], r["marble_arm"], r["baseline_arm"],
                        r["effect_fraction"], fixed)
    out = {"seeds": v["seeds"], "arms": v["arms"], "questions": v["questions"], "levels": v["levels"],
           "b_equivalence": mult["b_equivalence"], "replication": halves["status"],
           "replication_questions": {q: s["status"] for q, s in halves.get("questions", {}).items()}}
    if r.get("micro_batch") is not None:
        out.update(beside_questions(main, control, r["rewards"], r["specialists"], r["marble_arm"],
                                    r["baseline_arm"], r["micro_batch"], r.get("costs") or {}, fixed,
                                    r["effect_fraction"]))
    return json.loads(json.dumps(finite_or_null(out)))  # as the file reads back: string keys, nulls


def write_per_seed(path: Path, measures, rewards, specialists, **settings) -> None:
    write_json(path, per_seed_record(measures, rewards, specialists, **settings))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m marble.experiments.claim_per_seed", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", type=Path, help="a claim per-seed file (results/claim/per_seed.json)")
    p.add_argument("--markdown", action="store_true", help="the headline as docs/claim.md's table")
    args = p.parse_args(argv)
    try:
        out = headline(json.loads(args.file.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"claim_per_seed: error: {args.file}: {exc}", file=sys.stderr)
        return 2
    print(headline_markdown(out) if args.markdown else json.dumps(out, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
