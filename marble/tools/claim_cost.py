"""Counted cost of each `claim` arm: `marble bench flops` rows priced with the arm's cadence.

    python -m marble.tools.claim_cost --flops FLOPS.json --arms '{"arm": {preset, max_steps, set}}'
        --model MODEL_DIR --out COST.json

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
from marble.balancers.cadence import run_overhead


def arm_costs(arms: dict, row_flops: dict, model_dir: str) -> dict:
    """arm -> run_overhead (flops, ratio to a weighted-sum run without diagnostics, solves)."""
    out = {}
    for name, spec in arms.items():
        sets = [f"model.path={model_dir}", *spec["set"], f"train.max_steps={int(spec['max_steps'])}"]
        out[name] = run_overhead(load_config(spec["preset"], overrides=sets), row_flops)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m marble.tools.claim_cost", description=__doc__)
    p.add_argument("--flops", required=True, help="marble bench flops --json output")
    p.add_argument("--arms", required=True, help="JSON: arm -> {preset, max_steps, set}")
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    try:
        with open(args.flops, encoding="utf-8") as fh:
            rows = {row: r["flops"] for row, r in json.load(fh)["rows"].items()}
        costs = arm_costs(json.loads(args.arms), rows, args.model)
    except (OSError, KeyError, ValueError, ConfigError) as exc:
        print(f"claim_cost: error: {exc}", file=sys.stderr)
        return 2
    write_json(args.out, costs)
    for name, c in costs.items():
        print(f"{name}: {c['flops']:.3e} FLOPs, x{c['ratio']:.2f} a weighted-sum run, "
              f"{c['full_solves']} full-solve micro-steps")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
