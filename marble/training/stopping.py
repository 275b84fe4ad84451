"""Graceful stop for requeue: SIGUSR1 / SIGTERM -> finish the step, checkpoint, exit 75.

SLURM sends SIGUSR1 `--signal=USR1@N` seconds before a job's time limit (and SIGTERM on
preemption). `StopRequest` only records the signal; the training loop asks
`StopRequest.agreed()` after every optimizer step, which all-reduces the flag so every
torchrun rank stops after the same step even when the signal reached them at different
times (or reached only some of them). The loop then writes a checkpoint and
`marble train` exits with EXIT_REQUEUE; `workflow/scripts/torchrun_slurm.sh` turns that
into `scontrol requeue`, and the requeued job resumes from the checkpoint.

torchrun reports any failed worker as its own exit status 1, so the code alone cannot
cross it: when `MARBLE_REQUEUE_FILE` is set, the stopping process also writes that file,
which the wrapper checks after torchrun returns.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

from marble.runtime.io import write_text

# No torch here: `marble train` installs the handlers before its heavy imports, so a stop
# signal that arrives while torch, the model and the rewards load is flagged too.

# EX_TEMPFAIL of sysexits.h ("temporary failure; the user is invited to retry"): not a
# status that python, torch or torchrun use for anything else.
EXIT_REQUEUE = 75
REQUEUE_FILE_ENV = "MARBLE_REQUEUE_FILE"
STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)


class StopRequest:
    """Context manager: while active, STOP_SIGNALS set a flag instead of killing us."""

    def __init__(self, signals=STOP_SIGNALS):
        self.signals = tuple(signals)
        self.signum: int | None = None
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

    @property
    def requested(self) -> bool:
        """A stop signal reached this process."""
        return self.signum is not None

    @property
    def signal_name(self) -> str | None:
        return None if self.signum is None else signal.Signals(self.signum).name

    def agreed(self) -> bool:
        """True on every rank when any rank was signalled. A collective: every rank
        must call it at the same point (after each optimizer step)."""
        import torch

        from marble.runtime import distributed as dist

        flag = torch.tensor([1.0 if self.requested else 0.0], dtype=torch.float32)
        return bool(dist.all_reduce_sum_(flag).item() > 0)


def write_requeue_file(step: int, reason: str | None) -> Path | None:
    """Tell the SLURM wrapper that this run stopped to be requeued (see module doc)."""
    target = os.environ.get(REQUEUE_FILE_ENV)
    if not target:
        return None
    path = Path(target)
    write_text(path, f"step {step} {reason or 'stop'}\n")
    return path
