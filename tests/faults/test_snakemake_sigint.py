"""Fault: SIGINT sent to Snakemake's own process, not to its group (issue 38 item 5).

A real `snakemake` runs a tiny Snakefile whose one job sleeps ten minutes; `kill -INT` reaches
Snakemake alone (a supervisor, a user in another terminal). Snakemake 9's local executor then
waited for the job: the sleep ran to its end after Snakemake itself was gone. The project's
Snakefile forwards the interrupt to its jobs (`forward_interrupt_to_jobs`, called in
workflow/rules/common.smk); the tiny Snakefile here makes the same call, and the test reads
common.smk to hold the project to it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import pytest

from .interrupts import as_foreground_job

ROOT = Path(__file__).resolve().parents[2]
SNAKEMAKE = Path(sys.executable).with_name("snakemake")
CALL = "forward_interrupt_to_jobs()"


def sleeps(token: str) -> list[int]:
    """Pids of the job's `sleep` (found by its unique argument, not by the code under test)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if entry.name.isdigit() and argv[:1] == [b"sleep"] and token.encode() in argv:
            found.append(int(entry.name))
    return found


@contextmanager
def snakemake_running_its_job(folder: Path, token: str, command: list[str]):
    """Start `command` (a real Snakemake, as a terminal's foreground job, in a session of its
    own) in `folder` and wait until its job's `sleep <token>` runs; afterwards never leave
    the sleep or Snakemake behind, whatever happened."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(as_foreground_job(command), cwd=folder, env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while not sleeps(token) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert sleeps(token), f"the job never started: {proc.communicate(timeout=30)[0][-2000:]}"
        yield proc
    finally:
        for pid in sleeps(token):
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        if not proc.stdout.closed:  # a test that read its output has closed it
            proc.communicate()


@pytest.mark.fault("SIGINT to Snakemake's own process (its jobs must stop)")
@pytest.mark.parametrize("to_group", [False, True], ids=["kill -INT pid", "Ctrl-C to the group"])
def test_sigint_to_snakemake_alone_stops_its_jobs(tmp_path, fault_trials, to_group):
    """The group's Ctrl-C (each job gets it twice now: the terminal's and Snakemake's) must
    still end everything and leave no Snakemake lock."""
    if not SNAKEMAKE.is_file():
        pytest.skip(f"no snakemake beside {sys.executable}")
    common = (ROOT / "workflow" / "rules" / "common.smk").read_text(encoding="utf-8")
    fault_trials.record(CALL in common and "from marble.workflow.interrupts import" in common,
                        "workflow/rules/common.smk forwards Snakemake's interrupt")
    token = f"6{uuid.uuid4().int % 10**6:06d}.5"  # a unique duration: `sleep 6123456.5`
    (tmp_path / "Snakefile").write_text(
        f"from marble.workflow.interrupts import forward_interrupt_to_jobs\n{CALL}\n\n"
        f"rule all:\n    output: 'done.txt'\n    shell: 'sleep {token} && touch {{output}}'\n")
    command = [str(SNAKEMAKE), "-c1", "--profile", str(ROOT / "workflow" / "profiles" / "local")]
    with snakemake_running_its_job(tmp_path, token, command) as proc:
        if to_group:
            os.killpg(proc.pid, signal.SIGINT)
        else:
            os.kill(proc.pid, signal.SIGINT)  # Snakemake's own process, not its group
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
        fault_trials.record(proc.returncode is not None,
                            f"Snakemake ended after the interrupt (exit {proc.returncode})")
        deadline = time.monotonic() + 10
        while sleeps(token) and time.monotonic() < deadline:
            time.sleep(0.1)
        fault_trials.record(not sleeps(token), f"the job it started is gone (left: {sleeps(token)})")
        fault_trials.record(not (tmp_path / "done.txt").exists(), "no output of the interrupted job")
        locks = sorted(p.name for p in (tmp_path / ".snakemake" / "locks").glob("*"))
        fault_trials.record(not locks, f"no Snakemake lock left ({locks})")  # it removes locks/ when done
    assert not fault_trials.lost, fault_trials.lost


# Test-only: a Ctrl-C lands between Snakemake's removal of its input and its output lock
# (the moment CI hit once by chance), sent by Snakemake's own file removal.
STRIKE_MID_UNLOCK = '''
import os as _os, signal as _signal
import snakemake.persistence.file as _persistence_file

class _OsStruckMidUnlock:
    def __getattr__(self, name):
        return getattr(_os, name)

    def remove(self, path, *, dir_fd=None):  # os.remove's own signature
        _os.remove(path, dir_fd=dir_fd)
        if str(path).endswith(".input.lock"):
            _os.kill(_os.getpid(), _signal.SIGINT)  # the second Ctrl-C

_persistence_file.os = _OsStruckMidUnlock()
'''
RELEASE = "release_locks_uninterrupted()"


@pytest.mark.fault("a second Ctrl-C while Snakemake deletes its locks (no lock may be left)")
def test_a_second_ctrl_c_while_snakemake_unlocks_leaves_no_lock(tmp_path, fault_trials):
    if not SNAKEMAKE.is_file():
        pytest.skip(f"no snakemake beside {sys.executable}")
    common = (ROOT / "workflow" / "rules" / "common.smk").read_text(encoding="utf-8")
    fault_trials.record(RELEASE in common, "workflow/rules/common.smk makes the lock release whole")
    token = f"7{uuid.uuid4().int % 10**6:06d}.5"
    (tmp_path / "Snakefile").write_text(
        "from marble.workflow.interrupts import forward_interrupt_to_jobs, release_locks_uninterrupted\n"
        f"{CALL}\n{RELEASE}\n{STRIKE_MID_UNLOCK}\n"
        f"rule all:\n    input: 'seed.txt'\n    output: 'done.txt'\n"
        f"    shell: 'sleep {token} && touch {{output}}'\n")
    (tmp_path / "seed.txt").write_text("an input, so Snakemake writes both its lock files\n")
    with snakemake_running_its_job(tmp_path, token, [str(SNAKEMAKE), "-c1"]) as proc:
        os.killpg(proc.pid, signal.SIGINT)  # the first Ctrl-C; the second comes mid-unlock
        output = proc.communicate(timeout=60)[0]
        fault_trials.record(proc.returncode not in (0, None),
                            f"Snakemake ended, not successfully (exit {proc.returncode})")
        locks = sorted(p.name for p in (tmp_path / ".snakemake" / "locks").glob("*"))
        fault_trials.record(not locks, f"no Snakemake lock left ({locks}): {output[-1500:]}")
        ours = [t for t in output.split("Traceback")[1:] if "marble/workflow/interrupts.py" in t]
        fault_trials.record(not ours, f"no traceback through marble's frames: {ours[:1]}")
    assert not fault_trials.lost, fault_trials.lost
