"""One trainer per run folder: its TRAINING.lock, taken by `marble train` itself.

Where the lock lives: outside the run folder, because run folders sit inside DVC outputs
(`results/runs`) and `dvc checkout --force` deletes what an output folder holds beyond its
cached version: a lock there vanished under a live trainer and a second one was admitted.
The lock of `<project>/<rel>` is `<project>/.marble/locks/<rel>/TRAINING.lock`, the
project being the nearest folder above the run with a `dvc.yaml`, `.dvc`, `.git` or `Snakefile`
(`$MARBLE_STATE_DIR` replaces `<project>/.marble`); a run outside any project keeps it
in a sibling `.marble-locks/<name>/`. `marble evaluate` takes EVALUATION.lock of its
output folder the same way (`acquire(folder, name=EVAL_LOCK_NAME)`).

The lock is taken by global rank 0 before the model loads, so every way of starting a
trainer (Snakemake, the SLURM launcher, torchrun by hand, a restarted Snakemake that
resubmits a run whose first job still runs) meets it. It records who owns the run:

    {"pid": 1234, "host": "node01", "job_id": "4242", "started": "2026-...Z"}

Taking it is atomic: the content is written to a private temporary file which is then
hard-linked to TRAINING.lock; link() fails when the name exists (also on NFS, unlike
O_EXCL on old clients), so two trainers can never both succeed and a reader never sees a
half-written lock. An existing lock is
  - ours to take over when its SLURM job id is this job's (a requeued job restarts as
    the same id, possibly on another host), when its pid is dead on this host (a killed
    trainer or a crashed launcher), or when its SLURM job is no longer running
    (`squeue`; a job lost with its node);
  - refused with RunLockError (one line naming the owner and what to do) otherwise,
    including an owner on another host that nothing here can check.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

LOCK_NAME = "TRAINING.lock"
EVAL_LOCK_NAME = "EVALUATION.lock"
STATE_ENV = "MARBLE_STATE_DIR"
PROJECT_MARKERS = ("dvc.yaml", ".dvc", ".git", "Snakefile")  # a copied workflow folder too


def project_root(folder: Path) -> Path | None:
    """The nearest folder at or above `folder` that holds a project marker."""
    for candidate in [folder, *folder.parents]:
        if any((candidate / marker).exists() for marker in PROJECT_MARKERS):
            return candidate
    return None


def lock_path(folder: Path, name: str = LOCK_NAME) -> Path:
    """Where the lock of `folder` lives: under the project's state folder, never inside
    `folder` (which DVC may delete or restore); see the module docstring."""
    folder = Path(folder).expanduser().resolve()
    root = project_root(folder.parent)
    if root is None:
        return folder.parent / ".marble-locks" / folder.name / name
    state = Path(os.environ.get(STATE_ENV) or root / ".marble")
    return state / "locks" / folder.relative_to(root) / name


class RunLockError(RuntimeError):
    """Another live trainer owns the run folder (or the lock cannot be read)."""


def _this_owner() -> dict:
    return {"pid": os.getpid(), "host": socket.gethostname(),
            "job_id": os.environ.get("SLURM_JOB_ID") or None,
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


# squeue states of a job that still holds its nodes (or will again: a requeued job).
_LIVE_STATES = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED",
                "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "STOPPED", "SIGNALING", "STAGE_OUT"}


def _slurm_job_live(job_id: str) -> bool | None:
    """Whether SLURM still runs `job_id`; None when squeue cannot tell (absent, error)."""
    if not shutil.which("squeue"):
        return None
    try:
        proc = subprocess.run(["squeue", "-h", "-j", str(job_id), "-o", "%T"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        # squeue exits 1 with "Invalid job id" for a job it no longer knows.
        return False if "Invalid job id" in proc.stderr else None
    return any(state.strip() in _LIVE_STATES for state in proc.stdout.split())


def read_owner(lock: Path) -> dict | None:
    """The lock's owner record; None when there is no lock."""
    try:
        text = lock.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        owner = json.loads(text)
        int(owner["pid"]), str(owner["host"])
    except (ValueError, KeyError, TypeError):
        raise RunLockError(f"{lock}: not a marble run lock ({text[:80]!r}); remove it if no "
                           f"trainer runs on this folder") from None
    return owner


def stale_reason(owner: dict) -> str | None:
    """Why `owner` no longer holds the run (None: it may still be training)."""
    job = os.environ.get("SLURM_JOB_ID")
    if job and owner.get("job_id") == job:
        return f"an earlier attempt of this SLURM job {job} (requeued)"
    if owner["host"] == socket.gethostname():
        if _pid_alive(int(owner["pid"])):
            return None  # a live process here is a live trainer, whatever squeue says
        return f"pid {owner['pid']} is dead on {owner['host']}"
    if owner.get("job_id") and _slurm_job_live(owner["job_id"]) is False:
        return f"SLURM job {owner['job_id']} is no longer running"
    return None


def describe(owner: dict) -> str:
    job = f", SLURM job {owner['job_id']}" if owner.get("job_id") else ""
    return f"pid {owner['pid']} on {owner['host']}{job}, since {owner.get('started', '?')}"


def _link_new(lock: Path, owner: dict) -> bool:
    """Create `lock` holding `owner` atomically; False when it already exists."""
    tmp = lock.with_name(f".{lock.name}.{uuid.uuid4().hex}")
    tmp.write_text(json.dumps(owner) + "\n", encoding="utf-8")
    try:
        os.link(tmp, lock)
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)


def _take_over(lock: Path, seen: dict) -> bool:
    """Move a stale lock aside; False if it changed since we judged it stale (someone
    else took it over first: their lock is put back)."""
    aside = lock.with_name(f".{lock.name}.stale.{uuid.uuid4().hex}")
    try:
        os.rename(lock, aside)
    except FileNotFoundError:
        return True  # already gone
    try:
        moved = json.loads(aside.read_text(encoding="utf-8"))
    except ValueError:
        moved = None
    if moved != seen:
        try:
            os.link(aside, lock)  # not the one we judged: hand it back
        except FileExistsError:
            pass
        aside.unlink(missing_ok=True)
        return False
    aside.unlink(missing_ok=True)
    return True


def acquire(run_dir: Path, log=print, name: str = LOCK_NAME) -> Path:
    """Take the lock of `run_dir` (`lock_path`) for this process; RunLockError if a live
    owner has it."""
    lock = lock_path(Path(run_dir), name)
    lock.parent.mkdir(parents=True, exist_ok=True)
    me = _this_owner()
    for _ in range(3):  # a lost take-over race re-reads the new owner
        if _link_new(lock, me):
            return lock
        owner = read_owner(lock)
        if owner is None:
            continue  # released between our link and read
        reason = stale_reason(owner)
        if reason is None:
            raise RunLockError(
                f"{run_dir} is being {'trained' if name == LOCK_NAME else 'evaluated'} by "
                f"{describe(owner)} ({lock}); not starting a second "
                f"{'trainer' if name == LOCK_NAME else 'evaluation'}. Wait for it or stop it "
                f"(scancel / kill); if it is gone, remove {lock}")
        if _take_over(lock, owner):
            log(f"marble: taking over {lock}: {reason}")
    raise RunLockError(f"{lock}: could not take the lock (another trainer keeps taking it)")


def release(lock: Path) -> None:
    """Drop the lock if it is still ours (a take-over may have replaced it).

    Called on the way out, often after the error that ends the run: a lock that cannot be
    read or removed (the file system went read-only, the folder's permissions changed) is one
    line, never a traceback that replaced the run's own error and its exit 2. Left behind,
    it is stale once this process is gone and the next trainer takes it over (stale_reason)."""
    try:
        owner = read_owner(lock)
        if owner and owner["pid"] == os.getpid() and owner["host"] == socket.gethostname():
            lock.unlink(missing_ok=True)
    except RunLockError:
        return
    except OSError as exc:
        print(f"marble: note: the lock {lock} stays ({exc.strerror or exc}); the next run takes it "
              "over once this process is gone", file=sys.stderr)
