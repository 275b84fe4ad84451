"""Graceful stop: SIGUSR1 -> checkpoint and requeue (exit 75); SIGTERM -> checkpoint and stop.

SLURM sends SIGUSR1 `--signal=USR1@N` seconds before a job's time limit: the job asked for
it, so the run checkpoints and exits EXIT_REQUEUE, which the wrapper turns into a requeue.
SIGTERM is someone else's decision (`scancel`, an admin, a preemption, Snakemake's Ctrl-C):
the run checkpoints the step in flight and exits EXIT_CANCELLED, and nothing requeues it, so
a cancelled job stays cancelled (under PreemptMode=REQUEUE slurmctld requeues a preempted
job itself; docs/cluster.md, "Time limits"). A TERM after a USR1 wins: a cancel during the
time-limit stop is still a cancel. `StopRequest` only records the signals; the loop asks
`StopRequest.agreed()` after every optimizer step, which all-reduces the flag so every
torchrun rank stops after the same step even when the signal reached them at different
times (or reached only some of them). The loop then writes a checkpoint and
`marble train` exits with EXIT_REQUEUE; `workflow/scripts/torchrun_slurm.sh` turns that
into `scontrol requeue`, and the requeued job resumes from the checkpoint.

torchrun reports any failed worker as its own exit status 1, so the code alone cannot
cross it: when `MARBLE_REQUEUE_FILE` is set, the stopping process also writes that file,
which the wrapper checks after torchrun returns.

No requeue storm: a job whose time limit leaves no room for a step after the warning would
requeue forever without progress. `stalled_attempts` counts, per SLURM job id, the attempts
in a row that stopped for a requeue without finishing a step (beside the run lock, outside
the run folder); at MAX_STALLED_ATTEMPTS the run stops for good with a message saying why.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path

from marble.training.run_lock import lock_path

from marble.runtime.io import write_text

# No torch here: `marble train` installs the handlers before its heavy imports, so a stop
# signal that arrives while torch, the model and the rewards load is flagged too.

# EX_TEMPFAIL of sysexits.h ("temporary failure; the user is invited to retry"): not a
# status that python, torch or torchrun use for anything else.
EXIT_REQUEUE = 75
# 128 + SIGTERM, the shell's status of a process ended by TERM: a cancelled run, checkpointed.
EXIT_CANCELLED = 128 + int(signal.SIGTERM)
REQUEUE_FILE_ENV = "MARBLE_REQUEUE_FILE"
STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)
# The weight of "a rank saw SIGTERM" in agreed()'s one all-reduce: above any world size (so
# a sum tells both "someone was signalled" and "someone was cancelled"), exact in float32.
_CANCEL_WEIGHT = 1 << 16
# Attempts in a row that requeue without finishing a step before the run stops for good:
# one such attempt is normal (a USR1 that came while the model loaded), three are a pattern.
MAX_STALLED_ATTEMPTS = 3
STALL_FILE = "REQUEUE_STALLS.json"


class StopRequest:
    """Context manager: while active, STOP_SIGNALS set a flag instead of killing us."""

    def __init__(self, signals=STOP_SIGNALS):
        self.signals = tuple(signals)
        self.signum: int | None = None
        self.cancel_agreed = False  # some rank saw SIGTERM (set by agreed())
        self._seen: set[int] = set()
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "StopRequest":
        # Handlers can only be installed from the main thread; elsewhere (a library
        # caller's worker thread) the default dispositions stay and nothing is flagged.
        if threading.current_thread() is threading.main_thread():
            for sig in self.signals:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum, frame) -> None:
        # Only record: the step in flight finishes and the loop decides at its end.
        if self.signum is None:
            self.signum = signum
        self._seen.add(signum)

    @property
    def requested(self) -> bool:
        """A stop signal reached this process."""
        return self.signum is not None

    @property
    def cancelled(self) -> bool:
        """A stop nobody asked to requeue: SIGTERM here, or on any rank (agreed())."""
        return self.cancel_agreed or signal.SIGTERM in self._seen

    @property
    def signal_name(self) -> str | None:
        """The signal that decides what follows: SIGTERM once seen anywhere, else the first."""
        if self.cancelled:
            return "SIGTERM"
        return None if self.signum is None else signal.Signals(self.signum).name

    def agreed(self) -> bool:
        """True on every rank when any rank was signalled. A collective: every rank
        must call it at the same point (after each optimizer step)."""
        import torch

        from marble.runtime import distributed as dist

        local = (1.0 if self.requested else 0.0) + (_CANCEL_WEIGHT if signal.SIGTERM in self._seen else 0.0)
        total = dist.all_reduce_sum_(torch.tensor([local], dtype=torch.float32)).item()
        self.cancel_agreed = self.cancel_agreed or total >= _CANCEL_WEIGHT
        return total > 0


def write_requeue_file(step: int, reason: str | None, saved: bool) -> Path | None:
    """Tell the SLURM wrapper that this run stopped to be requeued (see module doc); the
    line says whether a checkpoint of `step` was written, which the wrapper's log repeats."""
    target = os.environ.get(REQUEUE_FILE_ENV)
    if not target:
        return None
    path = Path(target)
    write_text(path, f"step {step} {reason or 'stop'} {'with a checkpoint' if saved else 'without a checkpoint'}\n")
    return path


def stalled_attempts(state: Path, job_id: str | None, progressed: bool) -> int:
    """Record one attempt that stops for a requeue; return how many in a row made no step.

    `state`: the run's STALL_FILE (beside its lock: the run folder is DVC's to restore).
    Counted per job id, so a job resubmitted by hand starts with a clean count."""
    try:
        old = json.loads(state.read_text())
    except (OSError, ValueError):
        old = {}
    count = 0 if progressed else (old.get("stalled", 0) if old.get("job_id") == job_id else 0) + 1
    state.parent.mkdir(parents=True, exist_ok=True)
    write_text(state, json.dumps({"job_id": job_id, "stalled": count}) + "\n")
    return count


def stall_reason(count: int, step: int) -> str | None:
    """Why a run that requeued `count` times in a row without a step stops for good (or None)."""
    if count < MAX_STALLED_ATTEMPTS:
        return None
    return (f"{count} attempts in a row stopped for a requeue before finishing a step (still at step "
            f"{step}): the job's time limit leaves no room for one step after the time-limit warning. "
            f"Not requeued again: raise train.runtime or lower train.requeue_signal_s (`marble doctor` "
            f"checks them against the plan's step time), then resubmit; the run resumes from step {step}")


def stall_check(out_dir: Path, start_step: int, final_step: int) -> str | None:
    """Count this attempt's requeue stop (main rank, SLURM jobs only: without SLURM nothing
    requeues by itself, so nothing can storm); the reason to stop for good, or None."""
    job_id = os.environ.get("SLURM_JOB_ID")
    if not job_id:
        return None
    count = stalled_attempts(lock_path(Path(out_dir), STALL_FILE), job_id, final_step > start_step)
    return stall_reason(count, final_step)
