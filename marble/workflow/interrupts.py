"""An interrupt sent to Snakemake's own process stops the jobs it started (issue 38 item 5).

A Ctrl-C in a terminal reaches the whole foreground process group: Snakemake and every job
it runs. `kill -INT <snakemake pid>` (a scheduler, a supervisor, a user in another terminal)
reaches Snakemake alone: its local executor then waits for its running jobs (its cancel is
a thread pool's shutdown, which signals nobody), so a training ran on for hours after the
interrupt, headless, beside the next run. The Snakefile calls `forward_interrupt_to_jobs()`:
the first SIGINT Snakemake gets is passed on to every process under it, as `make` does,
then Snakemake's own handling runs (KeyboardInterrupt: it cleans up its locks and exits).
A job that got the group's Ctrl-C already gets a second one: our jobs stop on the first
(training resumes from its checkpoints, an evaluation from its rows), so that is harmless.
SIGTERM keeps Snakemake's meaning: no new job, the running ones finish.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path


def process_table(proc: Path = Path("/proc")) -> dict[int, int]:
    """{pid: parent pid} of every process visible in /proc (empty where there is no /proc)."""
    table = {}
    for entry in proc.iterdir() if proc.is_dir() else ():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        # `pid (comm) state ppid ...`: comm may hold spaces and parentheses, so split after the last ")".
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 1 and fields[1].isdigit():
            table[int(entry.name)] = int(fields[1])
    return table


def descendants(root: int, parents: dict[int, int]) -> list[int]:
    """Every process under `root` (children before grandchildren), from a {pid: ppid} table."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    out, frontier = [], [root]
    while frontier:
        frontier = [c for pid in frontier for c in sorted(children.get(pid, ())) if c != root]
        out += frontier
    return out


def forward_interrupt_to_jobs() -> bool:
    """Install the SIGINT handler in this (Snakemake's) process; whether it was installed.
    Not where SIGINT is ignored (a run started in the background keeps ignoring Ctrl-C) or
    off the main thread (Python installs handlers only there)."""
    if threading.current_thread() is not threading.main_thread():
        return False
    previous = signal.getsignal(signal.SIGINT)
    if previous in (signal.SIG_IGN, None):
        return False
    me, forwarded = os.getpid(), []

    def on_interrupt(signum, frame):
        if not forwarded:  # once: a second Ctrl-C is Snakemake's "quit now", nothing more to pass on
            forwarded.append(signum)
            for pid in descendants(me, process_table()):
                try:
                    os.kill(pid, signal.SIGINT)
                except (ProcessLookupError, PermissionError):
                    pass
        if callable(previous):
            previous(signum, frame)
        else:  # SIG_DFL: what the default would do to Snakemake
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_interrupt)
    return True
