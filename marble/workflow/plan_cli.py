"""`marble plan`: what a target of the workflow would run, and what it costs.

    marble plan --configfile config/paper.yaml [site.yaml] [--target paper_tables] [--json plan.json]
                [--bench results/bench/step.json]

Runs Snakemake's own dry run of the target (`snakemake -n TARGET --configfile ...` in the
workflow folder), so the jobs priced are exactly those it would start: a finished run or
evaluation costs nothing, and `eval_only` prices evaluation only. Prints the plan a dry run
prints (marble.workflow.plan_log: GPU-hours from counted FLOPs, with the utilisation it
assumes or the bench measured); --json writes it as JSON too.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from marble.runtime import install

from marble.workflow.plan_log import BENCH_ENV, JSON_ENV


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="marble plan", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    # --configfile as in snakemake and `marble doctor`; --config, its first name, still works.
    p.add_argument("--configfile", "--config", dest="config", type=Path, nargs="+", default=None,
                   help="workflow config file(s), merged in order (default: config.yaml); "
                        "--config is the same")
    p.add_argument("--target", default="all", help="the Snakemake target to price (default: all)")
    p.add_argument("--root", type=Path, default=Path.cwd(), help="the workflow folder")
    p.add_argument("--bench", type=Path, help="`marble bench step` JSON whose measured time "
                   "replaces the assumed utilisation (default: results/bench/step.json)")
    p.add_argument("--json", type=Path, help="also write the plan as JSON here")
    return p


def snakemake_command(root: Path) -> str:
    """The snakemake beside this Python (the venv's), else the one on PATH."""
    beside = Path(sys.executable).parent / "snakemake"
    found = str(beside) if beside.is_file() else shutil.which("snakemake")
    if not found:
        raise SystemExit(f"marble plan: snakemake is not installed ({install.extra('workflow')})")
    return found


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    for path in args.config or []:
        if not (args.root / path).is_file() and not path.is_file():
            raise SystemExit(f"marble plan: --configfile {path}: no such file")
    configs = [str(p.resolve() if p.is_file() else args.root / p) for p in args.config or []]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "plan.json"
        env = {**os.environ, JSON_ENV: str(out)}
        if args.bench:
            env[BENCH_ENV] = str(args.bench.resolve())
        cmd = [snakemake_command(args.root), "-n", args.target, "--quiet", "rules"]
        cmd += ["--configfile", *configs] if configs else []
        proc = subprocess.run(cmd, cwd=args.root, env=env, capture_output=True, text=True, check=False)
        if proc.returncode != 0 or not out.is_file():
            sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
            raise SystemExit(f"marble plan: `{' '.join(cmd[1:])}` did not list a plan (exit {proc.returncode})")
        plan = json.loads(out.read_text(encoding="utf-8"))
    print(f"{' '.join(str(c) for c in args.config or ['config.yaml'])} ({args.target}):")
    print(plan["text"])
    if args.json:
        from marble.runtime.io import write_json

        write_json(args.json, plan)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
