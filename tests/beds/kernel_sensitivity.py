"""How far a tiny run moves across CPU kernels and thread counts (issue 36 item 5).

    python -m beds.kernel_sensitivity --table data/datasets/tiny/train.parquet \
        --test data/datasets/tiny/test.parquet --steps 3 --seed 1 --work tmp/kernels \
        --json results/kernels.json [--variants default,avx2,threads2] [--pretrain]

Each variant runs the same commands in a fresh process whose environment differs only in
`ATEN_CPU_CAPABILITY` (which vectorised kernels ATen dispatches to: `default` is what this CPU
offers, e.g. avx512; `avx2`, `default` = no override) and `OMP_NUM_THREADS` (reductions split
over threads add in another order): with `--pretrain`, `marble models pretrain` of the tiny
model (the pretrained weights are the first thing that differs between machines), then
`marble train --preset tiny` for `--steps` steps with a held-out evaluation at step 0 and the
last. Every variant is compared with the first: the largest absolute difference of each logged
metric (rewards, anti-aligned fractions at every level, losses), of each held-out reward and of
the pretrained weights. Bit-identical runs give 0 everywhere; a difference in the first
training step's rewards means the kernels already changed the rollouts.

A measurement to run by hand on a quiet machine (minutes per variant on the tiny preset), not
in CI; docs/claim.md says which results it showed to be machine-sensitive.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path

# variant -> environment overrides (None: the variable removed, the library's default)
VARIANTS = {
    "default": {"ATEN_CPU_CAPABILITY": None, "OMP_NUM_THREADS": "1"},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "OMP_NUM_THREADS": "1"},
    "default_threads2": {"ATEN_CPU_CAPABILITY": None, "OMP_NUM_THREADS": "2"},
}
# metrics compared: every numeric key of these families (metrics.jsonl / eval.jsonl)
PREFIXES = ("reward/", "anti_aligned", "cos_", "loss/", "grad_norm", "dilution/", "eval_reward/")


def variant_env(base: dict, overrides: dict) -> dict:
    """`base` with each override set, or removed where it is None."""
    env = dict(base)
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def _numeric(record: dict) -> dict[str, float]:
    return {k: float(v) for k, v in record.items()
            if k.startswith(PREFIXES) and isinstance(v, (int, float)) and not isinstance(v, bool)}


def max_abs_differences(ref: list[dict], other: list[dict]) -> dict[str, float]:
    """key -> the largest |ref - other| over the steps both logged (matched by `step`), for the
    numeric keys of PREFIXES; NaN on one side and a number on the other counts as inf (a run
    that lost a value has moved), NaN on both as 0."""
    by_step = {r["step"]: _numeric(r) for r in other if "step" in r}
    out: dict[str, float] = {}
    for rec in ref:
        theirs = by_step.get(rec.get("step"))
        if theirs is None:
            continue
        for key, a in _numeric(rec).items():
            if key not in theirs:
                continue
            b = theirs[key]
            if math.isnan(a) and math.isnan(b):
                d = 0.0
            elif math.isnan(a) or math.isnan(b):
                d = math.inf
            else:
                d = abs(a - b)
            out[key] = max(out.get(key, 0.0), d)
    return dict(sorted(out.items()))


def weight_difference(ref_dir: Path, other_dir: Path) -> float:
    """The largest |difference| over every tensor of the safetensors files both folders hold
    (the pretrained model's weights); NaN when they share none."""
    from safetensors.torch import load_file

    worst, seen = 0.0, False
    for path in sorted(ref_dir.rglob("*.safetensors")):
        twin = other_dir / path.relative_to(ref_dir)
        if not twin.is_file():
            continue
        a, b = load_file(str(path)), load_file(str(twin))
        for name in a.keys() & b.keys():
            seen = True
            worst = max(worst, float((a[name].double() - b[name].double()).abs().max()))
    return worst if seen else math.nan


def strict_json(value):
    """NaN -> None (nothing to compare), inf -> "inf" (a value lost on one side): strict JSON."""
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else "inf"
    return value


def _read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _run(cmd: list[str], env: dict, log: Path) -> None:
    with log.open("w", encoding="utf-8") as fh:
        proc = subprocess.run(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, check=False)
    if proc.returncode:
        raise SystemExit(f"kernel_sensitivity: {' '.join(cmd[:3])} failed (exit {proc.returncode}); see {log}")


def run_variant(name: str, args, env: dict) -> Path:
    """Pretrain (optionally) and train one variant in WORK/<name>; its folder."""
    out = args.work / name
    out.mkdir(parents=True, exist_ok=True)
    model = args.model
    if args.pretrain:
        model = out / "model"
        _run(["marble", "models", "pretrain", "--table", str(args.table), "--out", str(model),
              "--vae-steps", str(args.vae_steps), "--flow-steps", str(args.flow_steps),
              "--seed", str(args.seed), "--threads", env.get("OMP_NUM_THREADS", "1")],
             env, out / "pretrain.log")
    sets = [f"model.path={model}", f"data.train={args.table}", f"data.test={args.test}",
            f"train.seed={args.seed}", f"train.eval_every={args.steps}"]
    _run(["marble", "train", "--preset", "tiny", "--output-dir", str(out / "run"), "--fresh",
          *[x for s in sets for x in ("--set", s)], "--max-steps", str(args.steps)], env, out / "train.log")
    return out


def compare(folders: dict[str, Path], pretrain: bool) -> dict:
    """Every variant against the first: metrics, held-out evaluation, pretrained weights."""
    names = list(folders)
    ref = folders[names[0]]
    out = {"reference": names[0], "variants": {}}
    for name in names[1:]:
        f = folders[name]
        metrics = max_abs_differences(_read_jsonl(ref / "run/metrics.jsonl"),
                                      _read_jsonl(f / "run/metrics.jsonl"))
        evals = max_abs_differences(_read_jsonl(ref / "run/eval.jsonl"), _read_jsonl(f / "run/eval.jsonl"))
        entry = {"metrics": metrics, "eval": evals,
                 "largest": max([*metrics.values(), *evals.values()], default=math.nan)}
        if pretrain:
            entry["pretrained_weights"] = weight_difference(ref / "model", f / "model")
        out["variants"][name] = entry
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m beds.kernel_sensitivity",
                                description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--table", type=Path, default=Path("data/datasets/tiny/train.parquet"))
    p.add_argument("--test", type=Path, default=Path("data/datasets/tiny/test.parquet"))
    p.add_argument("--model", type=Path, default=Path("data/models/tiny-sd3"),
                   help="the pretrained model every variant trains (without --pretrain)")
    p.add_argument("--pretrain", action="store_true", help="pretrain the tiny model in each variant too")
    p.add_argument("--vae-steps", type=int, default=200, help="config.yaml's pretrain.vae_steps")
    p.add_argument("--flow-steps", type=int, default=400, help="config.yaml's pretrain.flow_steps")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--variants", default=",".join(VARIANTS),
                   help=f"of {', '.join(VARIANTS)}; the first is the reference")
    p.add_argument("--work", type=Path, default=Path("tmp/kernel_sensitivity"))
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    names = [v for v in args.variants.split(",") if v]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown or len(names) < 2:
        p.error(f"--variants: need two or more of {', '.join(VARIANTS)} (got {args.variants!r})")
    folders = {n: run_variant(n, args, variant_env(os.environ, VARIANTS[n])) for n in names}
    report = compare(folders, args.pretrain)
    text = json.dumps(strict_json(report), indent=2, allow_nan=False)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
