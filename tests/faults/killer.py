"""SIGKILL a marble command at its k-th I/O (or compute) event: kill -9 at a chosen moment.

    python -m tests.faults.killer KILL_AT MODE {train|evaluate} <arguments of the command>

Events are the calls that write state (torch.save, safetensors save_file, os.replace,
os.fsync, append_jsonl, PIL image saves) and each optimizer step's compute. At event
KILL_AT the process kills itself with SIGKILL (no handler, no flush, no atexit), either
before the call (MODE `before`) or, for a write, after writing half of its bytes (MODE
`torn`: what a kill mid-write leaves). `count_events` counts the events of an
uninterrupted run in this process, so a test draws seeded moments from the real range.
"""

from __future__ import annotations

import io
import os
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


class EventCounter:
    """Numbers the events; `kill_at` (1-based) is where the process dies."""

    def __init__(self, kill_at: int | None = None, mode: str = "before"):
        self.kill_at, self.mode, self.count = kill_at, mode, 0
        self.names: list[str] = []

    def event(self, name: str, torn: Callable[[], None] | None = None) -> None:
        self.count += 1
        self.names.append(name)
        if self.count == self.kill_at:
            if self.mode == "torn" and torn is not None:
                torn()
            os.kill(os.getpid(), signal.SIGKILL)


def _half(path, data: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(data[: len(data) // 2])
        fh.flush()


@contextmanager
def instrumented(counter: EventCounter) -> Iterator[EventCounter]:
    """Wrap the writing functions marble calls so each is an event of `counter`."""
    import safetensors.torch
    import torch
    from PIL import Image

    import marble.evaluation.runner as runner
    import marble.runtime.io as mio
    import marble.training.checkpoint as ckpt
    import marble.training.metrics as metrics
    from marble.training.trainer import Trainer

    real = {"save": torch.save, "save_file": safetensors.torch.save_file,
            "replace": os.replace, "fsync": os.fsync, "append": mio.append_jsonl,
            "optimize": Trainer._optimize, "image": Image.Image.save}

    def save(obj, f, *a, **kw):
        def torn():
            buf = io.BytesIO()
            real["save"](obj, buf, *a, **kw)
            _half(f, buf.getvalue())
        counter.event(f"torch.save {Path(str(f)).name}", torn)
        return real["save"](obj, f, *a, **kw)

    def save_file(tensors, filename, *a, **kw):
        def torn():
            _half(filename, safetensors.torch.save(tensors, *a, **kw))
        counter.event(f"save_file {Path(str(filename)).name}", torn)
        return real["save_file"](tensors, filename, *a, **kw)

    def append_jsonl(path, record):
        def torn():
            import json
            with open(path, "ab") as fh:
                line = json.dumps(record, allow_nan=True).encode()
                fh.write(line[: len(line) // 2])
        counter.event(f"append_jsonl {Path(str(path)).name}", torn)
        return real["append"](path, record)

    def replace(src, dst, *a, **kw):
        counter.event(f"os.replace -> {Path(str(dst)).name}")
        return real["replace"](src, dst, *a, **kw)

    def fsync(fd):
        counter.event("os.fsync")
        return real["fsync"](fd)

    def optimize(self, *a, **kw):
        counter.event(f"optimizer step {self.step + 1}")
        return real["optimize"](self, *a, **kw)

    def image_save(self, fp, *a, **kw):
        if not isinstance(fp, (str, os.PathLike)):  # an in-memory encode: no write
            return real["image"](self, fp, *a, **kw)

        def torn():
            buf = io.BytesIO()
            real["image"](self, buf, *a, format=kw.get("format") or Path(str(fp)).suffix[1:]
                          .replace("jpg", "jpeg"))
            _half(fp, buf.getvalue())
        counter.event(f"image {Path(str(fp)).name}", torn)
        return real["image"](self, fp, *a, **kw)

    patches = [(torch, "save", save), (ckpt, "save_file", save_file),
               (safetensors.torch, "save_file", save_file), (os, "replace", replace),
               (os, "fsync", fsync), (mio, "append_jsonl", append_jsonl),
               (Trainer, "_optimize", optimize), (Image.Image, "save", image_save)]
    patches += [(metrics, "append_jsonl", append_jsonl), (runner, "append_jsonl", append_jsonl)]
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
    for obj, name, new in patches:
        setattr(obj, name, new)
    try:
        yield counter
    finally:
        for obj, name, old in reversed(saved):
            setattr(obj, name, old)


def run_command(command: str, argv: list[str]) -> int:
    if command == "train":
        from marble.train import main
    else:
        from marble.evaluate import main
    return main(argv)


def count_events(command: str, argv: list[str]) -> tuple[int, list[str]]:
    """(events, their names) of an uninterrupted run, in this process."""
    with instrumented(EventCounter()) as counter:
        assert run_command(command, argv) == 0
    return counter.count, counter.names


if __name__ == "__main__":
    kill_at, mode, command, *rest = sys.argv[1:]
    with instrumented(EventCounter(int(kill_at), mode)):
        code = run_command(command, rest)
    sys.exit(code)
