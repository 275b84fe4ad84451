"""An interrupt sent to Snakemake's own process stops the jobs it started (issue 38 item 5).

A Ctrl-C in a terminal reaches the whole foreground process group: Snakemake and every job
it runs. `kill -INT <snakemake pid>` (a scheduler, a supervisor, a user in another terminal)
reaches Snakemake alone: its local executor then waits for its running jobs (its cancel is
a thread pool's shutdown, which signals nobody), so a training ran on for hours after the
interrupt, headless, beside the next run. The Snakefile calls `forward_interrupt_to_jobs()`:
the first SIGINT Snakemake gets is passed on to every process under it, as `make` does,
then Snakemake's own handler is put back and gets the signal (KeyboardInterrupt: it cleans
up its locks and exits; a second Ctrl-C is its "quit now").
A job that got the group's Ctrl-C already gets a second one: our jobs stop on the first
(training resumes from its checkpoints, an evaluation from its rows), so that is harmless.
SIGTERM keeps Snakemake's meaning: no new job, the running ones finish.

`release_locks_uninterrupted()` holds SIGINT and SIGTERM while Snakemake deletes its lock
files: it removes them one by one after a run or an interrupt, and a second Ctrl-C landing
between the two (seen in CI: 0.15 s after the first, on a loaded machine) left
`.snakemake/locks/0.output.lock`, so the next run refused until `--unlock`.
"""

from __future__ import annotations

import _thread
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
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


def _send_soon(pid: int, signum: int, delay_s: float = 0.05) -> None:
    """Send `signum` after `delay_s` (a helper thread's: the handler that started it has
    returned by then, so the main thread handles the signal where its own code is)."""
    time.sleep(delay_s)
    os.kill(pid, signum)


def forward_interrupt_to_jobs() -> bool:
    """Install the SIGINT handler in this (Snakemake's) process; whether it was installed.
    Not where SIGINT is ignored (a run started in the background keeps ignoring Ctrl-C) or
    off the main thread (Python installs handlers only there)."""
    if threading.current_thread() is not threading.main_thread():
        return False
    previous = signal.getsignal(signal.SIGINT)
    if previous in (signal.SIG_IGN, None):
        return False
    me = os.getpid()

    def on_interrupt(signum, frame):
        # Once: pass the interrupt on, give SIGINT back to Snakemake's own handler and have a
        # helper thread send it to us again 50 ms later, so Python runs that handler where
        # Snakemake's main thread is, not inside this frame (a signal sent from here, or while
        # waiting for a thread to start, is handled here): a
        # KeyboardInterrupt raised from this frame carried it into the traceback Snakemake
        # prints when a second Ctrl-C lands while it is still cleaning up.
        for pid in descendants(me, process_table()):
            try:
                os.kill(pid, signal.SIGINT)
            except (ProcessLookupError, PermissionError):
                pass
        signal.signal(signal.SIGINT, previous)  # SIG_DFL: the default action, on Snakemake
        _thread.start_new_thread(_send_soon, (me, signal.SIGINT))  # no wait for the thread to start

    signal.signal(signal.SIGINT, on_interrupt)
    return True


@contextmanager
def signals_held(signums: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> Iterator[None]:
    """Within the block each of `signums` is only noted; after it, its handler is put back
    and each noted signal is sent again (50 ms later, from a helper thread, so that the
    handler runs where the main thread then is, not in this frame). Blocking the signal
    with pthread_sigmask would not do: the kernel hands a process's signal to any thread
    that does not block it (Snakemake has several), and Python still runs the handler here.
    Off the main thread, or for a signal that is ignored or has a C-level handler, nothing
    changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in signums}
    previous = {s: h for s, h in previous.items() if h not in (None, signal.SIG_IGN)}
    noted: list[int] = []
    for signum in previous:
        signal.signal(signum, lambda got, frame: noted.append(got))
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for signum in dict.fromkeys(noted):
            _thread.start_new_thread(_send_soon, (os.getpid(), signum))


def release_locks_uninterrupted() -> bool:
    """Make Snakemake's lock release whole: its `unlock` runs under `signals_held`. Whether
    it was installed (False on a Snakemake whose persistence class has no `unlock`)."""
    import snakemake.persistence as persistence

    owner = getattr(persistence, "PersistenceBase", None) or getattr(persistence, "Persistence", None)
    release = getattr(owner, "unlock", None)
    if release is None:
        return False
    if getattr(release, "signals_held", False):  # the Snakefile is read more than once
        return True

    def unlock(self) -> None:
        with signals_held():
            release(self)

    unlock.signals_held = True
    owner.unlock = unlock
    return True
