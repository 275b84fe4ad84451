"""Live monitoring: the step metrics of `metrics.jsonl` also go to the trackers chosen in
the run config (`logging.backends`): TensorBoard, Weights & Biases, DVCLive.

`metrics.jsonl` is always written (the record of the run); trackers are extras for
watching a long job. Only rank 0 opens them (the trainer builds them with the metrics
log). A tracker whose package is missing or that fails to start (or later fails to
log) warns and is dropped: training goes on. Offline modes are the trackers' own
(`WANDB_MODE=offline`, `DVCLIVE_...`): read from the environment, never overridden here.
"""

from __future__ import annotations

import hashlib
import math
import warnings
from pathlib import Path
from typing import Callable, Protocol

BACKENDS = ("jsonl", "tensorboard", "wandb", "dvclive")


class Tracker(Protocol):
    name: str

    def log(self, scalars: dict[str, float], step: int) -> None: ...

    def close(self) -> None: ...


def scalars(record: dict) -> dict[str, float]:
    """The finite numeric entries of a metrics record (no step, no strings). NaN is left
    out, not sent as 0: a tracker's gap is honest, a zero is not."""
    out = {}
    for key, value in record.items():
        if key == "step" or isinstance(value, (str, list, dict)) or value is None:
            continue
        try:
            number = float(value)
        except (TypeError, ValueError):
            continue
        if math.isfinite(number):
            out[key] = number
    return out


class TensorBoardTracker:
    name = "tensorboard"

    def __init__(self, out_dir: Path, run_name: str):
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

        self.writer = SummaryWriter(log_dir=str(out_dir / "tensorboard"))

    def log(self, scalars: dict[str, float], step: int) -> None:
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()  # a 48 h job: visible now, not at exit

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    name = "wandb"

    def __init__(self, out_dir: Path, run_name: str, project: str = "marble"):
        import wandb

        # One W&B run per run folder, resumed after a requeue: the id is a digest of the folder's
        # path (hash() of a str is salted per process, so a requeued job would start a new run).
        digest = hashlib.sha256(str(out_dir.resolve()).encode("utf-8")).hexdigest()[:8]
        self.run = wandb.init(project=project, name=run_name, dir=str(out_dir),
                              id=f"{run_name}-{digest}", resume="allow")

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.run.log(scalars, step=step)

    def close(self) -> None:
        self.run.finish()


class DVCLiveTracker:
    name = "dvclive"

    def __init__(self, out_dir: Path, run_name: str):
        from dvclive import Live

        # resume: a requeued job appends to the curves instead of starting over.
        self.live = Live(dir=str(out_dir / "dvclive"), resume=True, save_dvc_exp=False,
                         dvcyaml=None, report=None)

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.live.step = step
        for key, value in scalars.items():
            self.live.log_metric(key, value)
        self.live.next_step()

    def close(self) -> None:
        self.live.end()


FACTORIES: dict[str, Callable[[Path, str], Tracker]] = {
    "tensorboard": TensorBoardTracker,
    "wandb": WandbTracker,
    "dvclive": DVCLiveTracker,
}


def open_trackers(backends: list[str], out_dir: str | Path, run_name: str | None = None,
                  factories: dict[str, Callable[[Path, str], Tracker]] | None = None) -> list:
    """Start every backend but jsonl (written by MetricsLog); one that fails warns."""
    out_dir = Path(out_dir)
    run_name = run_name or out_dir.name
    factories = FACTORIES if factories is None else factories
    trackers = []
    for name in dict.fromkeys(backends):
        if name == "jsonl":
            continue
        if name not in factories:
            raise ValueError(f"logging.backends: unknown backend {name!r}; known: {', '.join(BACKENDS)}")
        try:
            trackers.append(factories[name](out_dir, run_name))
        except Exception as exc:  # noqa: BLE001  (any failure: missing package, no login, ...)
            warnings.warn(f"tracker {name} did not start ({type(exc).__name__}: {exc}); "
                          "training goes on, metrics.jsonl has every step", stacklevel=2)
    return trackers


class TrackerFanout:
    """Sends each record to the live trackers; one that raises is warned about and dropped."""

    def __init__(self, trackers: list):
        self.trackers = list(trackers)

    def log(self, record: dict) -> None:
        if not self.trackers or "step" not in record:
            return
        values, step = scalars(record), int(record["step"])
        for tracker in list(self.trackers):
            try:
                tracker.log(values, step)
            except Exception as exc:  # noqa: BLE001
                warnings.warn(f"tracker {tracker.name} failed ({type(exc).__name__}: {exc}); "
                              "dropped, training goes on", stacklevel=2)
                self.trackers.remove(tracker)

    def close(self) -> None:
        for tracker in self.trackers:
            try:
                tracker.close()
            except Exception as exc:  # noqa: BLE001
                warnings.warn(f"tracker {tracker.name} did not close cleanly: {exc}", stacklevel=2)
        self.trackers = []
