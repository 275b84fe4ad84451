"""Interrupting a real `snakemake` or `dvc repro` at a moment named by a file, as a user does.

`interrupt()` starts the command in a session of its own (its process group stands for a
terminal's foreground job), waits until a glob matches (a checkpoint marker: training; an
evaluation's run_info.json: evaluating; a job's output: Snakemake is about to write its
metadata), then sends signals: to the group (Ctrl-C, a session's SIGTERM or a crash) or
to the command's own process (`kill PID`, `kill -9 PID`). It waits for the command and
then for whatever it left running in the folder (an orphaned job runs to its end), and
reports what it saw: exit status, output, Snakemake's locks, the processes left behind.
"""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from test_workflow_lib import env

# (signal, to the whole process group?) by name; a Ctrl-C reaches the foreground group.
SIGNALS = {
    "Ctrl-C": (signal.SIGINT, True),
    "SIGTERM to the group": (signal.SIGTERM, True),
    "kill PID": (signal.SIGTERM, False),
    "kill -9 the group": (signal.SIGKILL, True),
    "kill -9 PID": (signal.SIGKILL, False),
}


# A terminal's foreground job gets Ctrl-C with SIGINT at its default. A test run started in
# the background by a non-interactive shell (`nohup .ci/run &`, `make test &`) inherits
# SIGINT and SIGQUIT ignored, and an ignored signal stays ignored across exec: Python then
# installs no KeyboardInterrupt handler, Snakemake and the trainer never see the Ctrl-C, and
# the run "completes" (exit 0 after an interrupt, seen in a backgrounded CI run). So the
# command starts through this exec wrapper, which restores both defaults (same pid, so the
# signals below still reach it; no preexec_fn in a threaded pytest).
_DEFAULT_SIGNALS = ("import os, signal, sys; "
                    "[signal.signal(s, signal.SIG_DFL) for s in (signal.SIGINT, signal.SIGQUIT)]; "
                    "os.execvp(sys.argv[1], sys.argv[1:])")


def as_foreground_job(cmd: list[str]) -> list[str]:
    return [sys.executable, "-c", _DEFAULT_SIGNALS, *cmd]


@dataclass
class Moment:
    """When to strike: `delay` seconds after the `nth` file matching one of `patterns`
    appears that was not there when the command started (a resumed run's next checkpoint,
    not the one an earlier run left)."""

    what: str
    patterns: tuple[str, ...]
    delay: float = 0.0
    nth: int = 1


@dataclass
class Outcome:
    code: int | None
    output: str
    missed: bool = False  # the command ended before the moment came
    locks: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)  # still running after `orphan_s`
    orphans: list[str] = field(default_factory=list)  # ran on after the command died
    struck: set[tuple] = field(default_factory=set)  # the files that marked the moment


def processes_in(work: Path) -> dict[int, str]:
    """{pid: command line} of every process whose working directory is `work`."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if os.path.realpath(proc / "cwd") != str(work.resolve()):
                continue
            args = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if any(args):
            found[int(proc.name)] = " ".join(a for a in args if a)[:160]
    return found


def matches(work: Path, moment: Moment) -> set[tuple]:
    """The matching files, each as (path, inode, mtime): a file removed and written again
    at the same path (Snakemake and DVC clear outputs before a job) counts as new."""
    found = set()
    for pattern in moment.patterns:
        for path in glob.glob(str(work / pattern)):
            try:
                st = os.stat(path)
            except OSError:
                continue
            found.add((path, st.st_ino, st.st_mtime_ns))
    return found


def wait_until(moment: Moment, work: Path, proc: subprocess.Popen, deadline: float,
               before: set[tuple]) -> bool:
    while time.time() < deadline and proc.poll() is None:
        if len(matches(work, moment) - before) >= moment.nth:
            return True
        time.sleep(0.01)  # 10 ms: from a job's output to Snakemake's metadata is ~0.1 s
    return False


def locks(work: Path) -> list[str]:
    folder = work / ".snakemake" / "locks"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def interrupt(work: Path, cmd: list[str], moment: Moment, hits: list[tuple[str, float]],
              log: Path, timeout: float = 600, orphan_s: float = 180) -> Outcome:
    """Run `cmd` in `work`; at `moment` send each (signal name, then wait s) of `hits`."""
    before = matches(work, moment)
    with open(log, "w") as out:
        proc = subprocess.Popen(as_foreground_job(cmd), cwd=work, env=env(), stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + timeout
        came = wait_until(moment, work, proc, deadline, before)
        struck = matches(work, moment) - before
        if came:
            time.sleep(moment.delay)
            for name, gap in hits:
                sig, group = SIGNALS[name]
                try:
                    (os.killpg if group else os.kill)(proc.pid, sig)
                except ProcessLookupError:
                    pass
                time.sleep(gap)
        try:
            code = proc.wait(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            code = proc.wait()
    orphans = processes_in(work)
    end = time.time() + orphan_s
    while processes_in(work) and time.time() < end:
        time.sleep(0.2)
    return Outcome(code=code, output=log.read_text(errors="replace"), missed=not came,
                   locks=locks(work), left=list(processes_in(work).values()),
                   orphans=list(orphans.values()), struck=struck)


def remedy(said: str, flags_ok: bool) -> str | None:
    """What a refusal tells the user to do: add `--rerun-incomplete` (Snakemake's own
    command only: `flags_ok`), or run `snakemake --unlock`."""
    # Their sentences, not the bare flags: Snakemake's banner repeats the command line.
    if flags_ok and "rerun your command with the --rerun-incomplete flag" in said:
        return "--rerun-incomplete"
    if "removed with the --unlock argument" in said:
        return "snakemake --unlock"
    return None


def run(work: Path, cmd: list[str], log: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=work, env=env(), capture_output=True, text=True, timeout=timeout)
    log.write_text(proc.stdout + proc.stderr)
    return proc
