"""Counted cost of each `claim` arm: `marble bench flops` rows priced with the arm's cadence.

    python -m marble.experiments.claim_cost --flops FLOPS.json --arms '{"arm": {preset, max_steps, set}}'
        --model MODEL_DIR --out COST.json
    python -m marble.experiments.claim_cost --print-rows --arms ... --model MODEL_DIR

`--print-rows` prints the comma-separated bench rows that price every arm (the claim and zoo
rules pass them to `marble bench flops --rows`): an arm of a new kind (issue 37's output-space
Gram, say) brings its row with it instead of failing the pricing after every training.

`marble bench flops --runs` prices presets; an arm is a preset plus overrides (N, the alpha
EMA), so each arm's config is loaded here and `marble.balancers.cadence.run_overhead`
counts its kinds of micro-step (solves, diagnostics) over its max_steps.
"""

from __future__ import annotations

import argparse
import json
import sys

from marble.config import ConfigError, load_config
from marble.runtime.io import write_json
from marble.balancers.cadence import rows_for, run_overhead


# A claim run measures cosines on every micro-step (the tiny preset's diagnostics_every 1), and
# those passes dominate its counted cost; what a user pays for the balancer itself is the
# same arm without diagnostics (`plain`), the figure "at the weighted sum's cost" is about.
NO_DIAGNOSTICS = "balancer.diagnostics_every=0"


def _arm_config(spec: dict, model_dir: str, plain: bool = False):
    sets = [f"model.path={model_dir}", *spec["set"], f"train.max_steps={int(spec['max_steps'])}"]
    return load_config(spec["preset"], overrides=sets + ([NO_DIAGNOSTICS] if plain else []))


def arm_rows(arms: dict, model_dir: str) -> list[str]:
    """The bench rows that price every arm as run and without diagnostics, sorted
    (`cadence.rows_for` of each arm's configs)."""
    return sorted(set().union({"weighted_sum"}, *(rows_for(_arm_config(spec, model_dir, plain))
                                                  for spec in arms.values() for plain in (False, True))))


BENCH_PRESET = "tiny"  # the preset claim.smk's `marble bench flops --preset` measures rows at


def _priced(cfg, row_flops: dict, bench_batch: int) -> dict:
    """run_overhead with `flops` scaled to the arm's micro-batch: a bench row is one micro-step
    at the bench preset's `train.batch_size`, and a micro-step's passes grow with its samples
    (issue 47: the sweep arms, 24 samples a micro-step, would count a quarter of their FLOPs).
    The ratio, against a weighted sum at the same micro-batch, needs no scaling."""
    cost = run_overhead(cfg, row_flops)
    cost["flops"] *= cfg.train.batch_size / bench_batch
    cost["micro_batch"] = cfg.train.batch_size
    return cost


def arm_costs(arms: dict, row_flops: dict, model_dir: str) -> dict:
    """arm -> run_overhead (flops, ratio to a weighted-sum run without diagnostics, solves),
    with `plain`: the same figures for the arm without diagnostics."""
    bench_batch = load_config(BENCH_PRESET, overrides=[f"model.path={model_dir}"]).train.batch_size
    out = {}
    for name, spec in arms.items():
        out[name] = _priced(_arm_config(spec, model_dir), row_flops, bench_batch)
        out[name]["plain"] = _priced(_arm_config(spec, model_dir, plain=True), row_flops, bench_batch)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m marble.experiments.claim_cost", description=__doc__)
    p.add_argument("--print-rows", action="store_true",
                   help="print the bench rows that price the arms (comma-separated) and exit")
    p.add_argument("--flops", help="marble bench flops --json output")
    p.add_argument("--arms", required=True, help="JSON: arm -> {preset, max_steps, set}")
    p.add_argument("--model", required=True)
    p.add_argument("--out")
    args = p.parse_args(argv)
    if not args.print_rows and not (args.flops and args.out):
        p.error("--flops and --out are required (or --print-rows)")
    try:
        if args.print_rows:
            print(",".join(arm_rows(json.loads(args.arms), args.model)))
            return 0
        with open(args.flops, encoding="utf-8") as fh:
            rows = {row: r["flops"] for row, r in json.load(fh)["rows"].items()}
        costs = arm_costs(json.loads(args.arms), rows, args.model)
    except (OSError, KeyError, ValueError, ConfigError) as exc:
        print(f"claim_cost: error: {exc}", file=sys.stderr)
        return 2
    write_json(args.out, costs)
    for name, c in costs.items():
        print(f"{name}: {c['flops']:.3e} FLOPs, x{c['ratio']:.2f} a weighted-sum run, "
              f"{c['full_solves']} full-solve micro-steps; without diagnostics "
              f"x{c['plain']['ratio']:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
