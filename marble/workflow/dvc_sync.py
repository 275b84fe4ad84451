"""DVC and Snakemake agree after a restore: modification times put in DAG order.

`dvc pull`, `dvc checkout` and a DVC stage's own checkout write files with fresh mtimes
in no particular order. Snakemake 9 reruns a job whose input is newer than its output
whatever `--rerun-triggers` says (the "updated input" check compares mtimes and, without
recorded checksums, as on a clean clone, cannot tell the content is the same), so an
evaluation stage would retrain, and `snakemake -n all` after a pull plans the whole DAG.

DVC knows by content hash what is current. What is current is made current for Snakemake
too with `snakemake <targets> --touch`: it touches exactly the jobs Snakemake would run,
in DAG order, and never creates a missing file. Two entry points:

    python -m marble.workflow.dvc_sync stage <stage> -- snakemake <target> ...
        dvc.yaml's stage command: DVC has just verified (or rerun) every upstream stage,
        so their targets are touched first; then the stage's own Snakemake call runs.
        Only the stage's own jobs can then run (an input that an upstream stage really
        changed is still newer than this stage's outputs, so it reruns what it must).
    python -m marble.workflow.dvc_sync restored
        After `dvc pull` / `dvc checkout`, before running Snakemake by hand: touches the
        targets of the leading stages `dvc status` reports as up to date.

Stages are taken in dvc.yaml order, which is the DAG order of this linear pipeline
(prepare -> train -> evaluate -> report; tests/test_dvc.py checks each stage only
depends on the ones before it).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import yaml

# The stages' own Snakemake triggers (dvc.yaml): touch what exactly those would run.
TRIGGERS = ["--rerun-triggers", "params", "input", "code"]


def stage_targets(dvc_yaml: dict) -> dict[str, str]:
    """{stage: the Snakemake target its cmd runs}, in dvc.yaml order."""
    out = {}
    for name, stage in dvc_yaml["stages"].items():
        words = stage["cmd"].split()
        at = words.index("snakemake")  # after the `python -m ... stage X --` wrapper
        out[name] = words[at + 1]
    return out


def upstream_targets(targets: dict[str, str], stage: str) -> list[str]:
    """Targets of the stages before `stage`."""
    names = list(targets)
    if stage not in targets:
        raise ValueError(f"dvc.yaml: no stage {stage!r} (stages: {', '.join(names)})")
    return [targets[n] for n in names[: names.index(stage)]]


def current_prefix(targets: dict[str, str], changed: set[str]) -> list[str]:
    """Targets of the leading stages DVC reports unchanged: a stage after a changed one is
    left alone (touching its target would touch the changed stage's jobs too)."""
    out = []
    for name, target in targets.items():
        if name in changed:
            break
        out.append(target)
    return out


def changed_stages(status_json: str) -> set[str]:
    """Stage names in `dvc status --json` output (absent: up to date). Keys may be
    `dvc.yaml:stage`."""
    data = json.loads(status_json or "{}")
    return {key.rsplit(":", 1)[-1] for key in data}


def touch(targets: list[str], snakemake: str = "snakemake") -> None:
    """Mark the jobs of `targets` done without running them, in DAG order."""
    if not targets:
        return
    cmd = [snakemake, *targets, "--touch", "-c1", "--quiet", "all", *TRIGGERS]
    print("dvc_sync:", " ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True)


def _load_targets(root: Path) -> dict[str, str]:
    return stage_targets(yaml.safe_load((root / "dvc.yaml").read_text(encoding="utf-8")))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m marble.workflow.dvc_sync",
                                description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="mode", required=True)
    st = sub.add_parser("stage", help="touch upstream stages' targets, then run the command")
    st.add_argument("stage")
    st.add_argument("command", nargs=argparse.REMAINDER)
    sub.add_parser("restored", help="after dvc pull/checkout: touch the up-to-date stages")
    args = p.parse_args(argv)
    root = Path.cwd()
    targets = _load_targets(root)
    if args.mode == "restored":
        proc = subprocess.run(["dvc", "status", "--json"], capture_output=True, text=True,
                              check=True)
        touch(current_prefix(targets, changed_stages(proc.stdout)))
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("stage: no command after --")
    touch(upstream_targets(targets, args.stage))
    return subprocess.run(command).returncode


if __name__ == "__main__":
    raise SystemExit(main())
