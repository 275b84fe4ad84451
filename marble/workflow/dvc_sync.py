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
import os
import signal
import subprocess
import sys
from pathlib import Path

import yaml

# The targets whose jobs the preflight doctor checks, when set (the Snakefile reads it).
PREFLIGHT_TARGETS_ENV = "MARBLE_PREFLIGHT_TARGETS"
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


# DVC runs a stage's command through a shell ($SHELL or /bin/sh -c), which may stay between.
SHELLS = {"sh", "bash", "dash", "zsh", "ksh", "fish"}


def runner_pid() -> int | None:
    """The process that runs this stage (DVC): the parent, or the parent of the shell
    between. None without psutil (a dependency of DVC, so there wherever DVC runs this)."""
    try:
        import psutil

        parent = psutil.Process(os.getppid())
        return parent.ppid() if parent.name() in SHELLS and parent.ppid() > 1 else parent.pid
    except Exception:  # noqa: BLE001 - no psutil, or the parent already gone
        return None


def _gone(pid: int | None) -> bool:
    """`pid` ended (a zombie too: dead, its parent not yet told)."""
    if pid is None:
        return False
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:  # not ours to inspect: take it as running
        return False


def wait_for(command: list[str], poll_s: float = 1.0) -> int:
    """Run `command` (Snakemake) to its end as a job of its own; its exit status (128 + N
    when it died of signal N, as a shell reports it).

    `subprocess.run` SIGKILLed Snakemake 0.25 s into its Ctrl-C cleanup (its
    KeyboardInterrupt path): `.snakemake/locks` stayed behind with a traceback. So the
    command runs in a process group of its own, and every Ctrl-C, SIGTERM or SIGHUP that
    reaches this wrapper (a terminal signals the foreground group it sits in) is passed to
    that group once: Snakemake and its jobs stop as they would in a terminal, and this
    wrapper waits for them. DVC has no SIGTERM handler and cannot survive a kill -9: when
    the process that runs the stage is gone, nobody will record the stage, so Snakemake and
    its jobs get what Ctrl-C sends instead of running on headless beside the next
    `dvc repro` (training resumes from its checkpoints, an evaluation from its samples)."""
    runner, proc, pending, passed = runner_pid(), None, [], []

    def forward(signum, frame):
        passed.append(signum)  # a stop already on its way: no second one when DVC is gone
        if proc is None:  # before the command started: passed on once it has
            pending.append(signum)
            return
        try:
            os.killpg(proc.pid, signum)
        except ProcessLookupError:
            pass

    stops = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {sig: signal.signal(sig, forward) for sig in stops}
    try:
        proc = subprocess.Popen(command, start_new_session=True)
        for signum in pending:
            os.killpg(proc.pid, signum)
        stopped = False
        while True:
            try:
                code = proc.wait(timeout=poll_s)
                break
            except subprocess.TimeoutExpired:
                # A SIGTERM to DVC's whole group reached Snakemake (and its jobs' graceful
                # stop: a checkpoint) already: a Ctrl-C after it would cut that stop short.
                if not stopped and not passed and _gone(runner):
                    stopped = True
                    print(f"dvc_sync: the process running this stage (pid {runner}) is gone: "
                          "stopping Snakemake as Ctrl-C would", file=sys.stderr, flush=True)
                    forward(signal.SIGINT, None)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 128 - code if code < 0 else code


def touch(targets: list[str], snakemake: str = "snakemake") -> int:
    """Mark the jobs of `targets` done without running them, in DAG order; the exit status."""
    if not targets:
        return 0
    cmd = [snakemake, *targets, "--touch", "-c1", "--quiet", "all", *TRIGGERS]
    print("dvc_sync:", " ".join(cmd), file=sys.stderr, flush=True)
    code = wait_for(cmd)
    if code:
        print(f"dvc_sync: marking the upstream stages done failed (exit {code}): "
              "see Snakemake's message above", file=sys.stderr, flush=True)
    return code


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
        return touch(current_prefix(targets, changed_stages(proc.stdout)))
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("stage: no command after --")
    # `dvc repro` runs the stages one after another: the doctor checks the whole pipeline's
    # jobs at the first. Per-stage targets widened the preflight snapshot at every stage and
    # reran the doctor, which rewrote prepare's out (results/preflight.txt) after DVC had
    # recorded it: the next repro restored prepare from its cache with fresh dates, and
    # Snakemake retrained every run (Snakefile: PREFLIGHT_TARGETS_ENV).
    os.environ[PREFLIGHT_TARGETS_ENV] = "all"
    return touch(upstream_targets(targets, args.stage)) or wait_for(command)


if __name__ == "__main__":
    raise SystemExit(main())
