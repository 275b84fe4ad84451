"""The checkpoint manager: save, load and find-last of every piece of training state.

A `CheckpointManager(run_dir, states={name: stateful, ...})` owns one run's checkpoints.
Each registered state has `state_dict()` and `load_state_dict(value)` (the optimizer, the
sampler and the balancer as they are; small wrappers below for plain attributes, the RNGs
and optional objects). `save(step)` captures every registered state; `resume()` finds the
newest intact checkpoint and restores every registered state, and refuses one that lacks
a registered state or holds one no registered state takes: adding a piece of state is
one line in the registry, and a resume cannot skip it.

The folder layout and what makes a checkpoint usable are marble.training.checkpoint_format's
(torch-free, shared with the workflow). A folder is assembled under a temporary name and
renamed into place, so a crash leaves either no checkpoint or a complete one (and a
`.checkpoint-*.tmp` folder that the next start removes). A file damaged later (a
truncated copy, a full disk on a sync, bit rot) or an empty marker is caught on resume:
`resume_checkpoint` warns naming the file and falls back to the previous usable one.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from marble.runtime import distributed as dist
from marble.runtime.io import atomic_path, fsync_tree, json_text
from marble.training.checkpoint_format import (
    ADAPTERS_FILE,
    COMPLETE,
    IDENTITY_FILE,
    LORA_DIR,
    OPTIMIZER_FILE,
    STATE_FILE,
    STATE_FILES,
    CheckpointError,
    checkpoint_dir,
    checkpoint_root,
    damaged_files,
    list_checkpoints,
    marker_text,
    read_identity,
    remove_stale_temporaries,
    usable_checkpoints,
)
from marble.training.run_dir import ADOPT_FLAG, identity_differences, identity_refusal

# What callers of the manager use beside it (resume's errors, the folder of a step, the
# verdict on a folder, the cleanup before a resume): the rest of the format is imported
# from checkpoint_format where it is needed.
__all__ = [
    "COMPLETE", "AttributeState", "CheckpointError", "CheckpointManager", "OptionalState",
    "RNGState", "Stateful", "capture_rng_state", "checkpoint_dir", "damaged_files",
    "latest_checkpoint", "list_checkpoints", "load_checkpoint", "prune_checkpoints",
    "remove_stale_temporaries", "restore_rng_state", "resume_checkpoint", "save_checkpoint",
]

log = logging.getLogger(__name__)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest usable checkpoint folder (marker parses, every hash matches), or None."""
    found = usable_checkpoints(run_dir, warn=False)
    return found[-1][1] if found else None


# ------------------------------------------------------------------ RNG state


def capture_rng_state() -> dict:
    """Python, numpy, torch (and CUDA) generator states as tensors/primitives."""
    np_state = np.random.get_state()
    state = {
        "python": _py_state_to_list(random.getstate()),
        "numpy": {
            "kind": str(np_state[0]),
            "keys": torch.from_numpy(np.asarray(np_state[1], dtype=np.int64)),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached_gaussian": float(np_state[4]),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict) -> None:
    random.setstate(_py_state_from_list(state["python"]))
    npd = state["numpy"]
    np.random.set_state((npd["kind"], npd["keys"].numpy().astype(np.uint32), npd["pos"],
                         npd["has_gauss"], npd["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _py_state_to_list(st: tuple) -> list:
    version, internal, gauss = st
    return [int(version), list(internal), gauss]


def _py_state_from_list(st: list) -> tuple:
    version, internal, gauss = st
    return (int(version), tuple(int(v) for v in internal), gauss)


# ------------------------------------------------------------------ adapters


def flatten_adapters(adapters: dict[str, dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    out = {}
    for adapter, tensors in adapters.items():
        if "::" in adapter:
            raise ValueError(f"adapter name {adapter!r} must not contain '::'")
        for key, value in tensors.items():
            out[f"{adapter}::{key}"] = value.detach().cpu().contiguous()
    return out


def unflatten_adapters(flat: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    out: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in flat.items():
        adapter, name = key.split("::", 1)
        out.setdefault(adapter, {})[name] = value
    return out


# ------------------------------------------------------------------ save / load


def save_checkpoint(
    ckpt_dir: str | Path,
    state: dict[str, Any],
    adapters: dict[str, dict[str, torch.Tensor]] | None = None,
    optimizer_state: dict | None = None,
    write_lora: Callable[[Path], None] | None = None,
    keep: int | None = 3,
    identity: dict | None = None,
) -> Path:
    """Write one checkpoint folder atomically, then prune to the newest `keep`.

    `write_lora(folder)` writes the diffusers-format LoRA (the trainer passes a closure
    over `save_lora_diffusers` with the EMA state). `identity`: the run's
    (marble.training.run_dir.run_identity), written as IDENTITY_FILE under the marker's hashes.
    """
    ckpt_dir = Path(ckpt_dir)
    with atomic_path(ckpt_dir) as tmp:
        tmp.mkdir(parents=True)
        if write_lora is not None:
            write_lora(tmp / LORA_DIR)
        if adapters is not None:
            save_file(flatten_adapters(adapters), str(tmp / ADAPTERS_FILE))
        if optimizer_state is not None:
            torch.save(optimizer_state, tmp / OPTIMIZER_FILE)
        torch.save(state, tmp / STATE_FILE)
        if identity is not None:
            (tmp / IDENTITY_FILE).write_text(json_text(identity, indent=1, sort_keys=True) + "\n",
                                             encoding="utf-8")
        # Every file and folder on disk before the marker that vouches for them: after a
        # node crash a marker never names a zero-length file.
        fsync_tree(tmp)
        with open(tmp / COMPLETE, "w", encoding="utf-8") as fh:
            fh.write(marker_text(tmp))
            fh.flush()
            os.fsync(fh.fileno())
        fsync_tree(tmp, files=False)
    if keep is not None and keep > 0:
        prune_checkpoints(ckpt_dir.parent.parent, keep)
    return ckpt_dir


def prune_checkpoints(run_dir: str | Path, keep: int) -> list[Path]:
    """Delete all but the newest `keep` usable checkpoints, and damaged ones older than
    the oldest kept; returns what was removed."""
    usable = usable_checkpoints(run_dir, warn=False)
    if keep <= 0 or len(usable) <= keep:
        return []
    oldest_kept = usable[-keep][0]
    removed = []
    for _, path in [(s, p) for s, p in list_checkpoints(run_dir) if s < oldest_kept]:
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def load_checkpoint(ckpt_dir: str | Path, map_location: str | torch.device = "cpu") -> dict:
    """{'state', 'adapters', 'optimizer', 'path'} of a complete checkpoint folder."""
    ckpt_dir = Path(ckpt_dir)
    if not (ckpt_dir / COMPLETE).is_file():
        raise FileNotFoundError(f"{ckpt_dir}: not a complete checkpoint (no {COMPLETE} marker)")
    out: dict[str, Any] = {"path": ckpt_dir}

    def read_pt(path: Path):
        return torch.load(path, map_location=map_location, weights_only=True)

    out["state"] = _read(ckpt_dir / STATE_FILE, read_pt)
    opt = ckpt_dir / OPTIMIZER_FILE
    out["optimizer"] = _read(opt, read_pt) if opt.is_file() else None
    ad = ckpt_dir / ADAPTERS_FILE
    out["adapters"] = (unflatten_adapters(_read(ad, lambda x: load_file(str(x))))
                       if ad.is_file() else None)
    return out


def _read(path: Path, reader: Callable[[Path], Any]) -> Any:
    """reader(path), with any failure to parse reported as a CheckpointError naming the
    file (torch says only "PytorchStreamReader failed reading zip archive")."""
    try:
        return reader(path)
    except Exception as exc:  # torch, safetensors and pickle raise a zoo of types
        raise CheckpointError(f"{path}: unreadable checkpoint file ({type(exc).__name__}: "
                              f"{exc})") from exc


# ------------------------------------------------------------------ resume


def resume_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest usable checkpoint (marble.training.checkpoint_format).

    A damaged one (bad marker, missing or changed file) is skipped with a warning naming
    its files. None when the run has no checkpoint with a marker; a CheckpointError naming
    the run folder when it has some and none is usable (resuming from nothing would
    silently restart a run that has trained).
    """
    found = list_checkpoints(run_dir)
    for _, path in reversed(found):
        damaged = damaged_files(path)
        if not damaged:
            return path
        log.warning("%s is damaged: %s; falling back to the previous complete checkpoint",
                    path, ", ".join(damaged))
    if found:
        raise CheckpointError(
            f"{run_dir}: none of its {len(found)} complete checkpoints is intact (see the "
            f"warnings above); restore one or move {checkpoint_root(run_dir)} away to "
            f"start over")
    return None


# ------------------------------------------------------------------ the manager


class Stateful(Protocol):
    """What the manager registers: torch's state_dict convention."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> Any: ...


class AttributeState:
    """A plain attribute of an object (the trainer's step and epoch counters) as a state."""

    def __init__(self, owner: object, name: str, kind: type = int):
        self.owner, self.name, self.kind = owner, name, kind

    def state_dict(self) -> Any:
        return self.kind(getattr(self.owner, self.name))

    def load_state_dict(self, value: Any) -> None:
        setattr(self.owner, self.name, self.kind(value))


class OptionalState:
    """An object only some runs have (fp16's GradScaler): None is saved without one, and a
    checkpoint restores into a run only when both have it or neither does."""

    def __init__(self, obj: Stateful | None, what: str):
        self.obj, self.what = obj, what

    def state_dict(self) -> Any:
        return None if self.obj is None else self.obj.state_dict()

    def load_state_dict(self, value: Any) -> None:
        if (value is None) != (self.obj is None):
            raise ValueError(f"the checkpoint {'lacks' if value is None else 'holds'} a "
                             f"{self.what} state and this run {'has' if self.obj else 'has none'}")
        if self.obj is not None:
            self.obj.load_state_dict(value)


class RNGState:
    """Python, numpy and torch (and CUDA) generators as one state."""

    def state_dict(self) -> dict:
        return capture_rng_state()

    def load_state_dict(self, state: dict) -> None:
        restore_rng_state(state)


class CheckpointManager:
    """Save, find-last and restore of one run's checkpoints through one registry of
    named states (the layout: marble.training.checkpoint_format).

    `states` maps a name to a Stateful; "adapters" and "optimizer" get files of their own
    (STATE_FILES), every other one is a key of state.pt. `write_lora(folder)` writes the
    diffusers-format export. On several ranks (all holding identical state) rank 0 writes
    and chooses; `is_main` says which rank this is. `identity`: this run's (run_dir.run_identity),
    recorded in every checkpoint; a checkpoint recording another is refused on load unless
    `adopt` (marble train --adopt-checkpoint: a deliberate warm start from another run).
    """

    def __init__(self, run_dir: str | Path, states: Mapping[str, Stateful],
                 write_lora: Callable[[Path], None] | None = None, keep: int | None = 3,
                 is_main: bool = True, identity: dict | None = None, adopt: bool = False):
        self.run_dir, self.states = Path(run_dir), dict(states)
        self.write_lora, self.keep, self.is_main = write_lora, keep, is_main
        self.identity, self.adopt = identity, adopt

    def save(self, step: int) -> Path:
        """Checkpoint `step` on the main rank (the others wait): every registered state."""
        path = checkpoint_dir(self.run_dir, step)
        if self.is_main:
            state = {name: value.state_dict() for name, value in self.states.items()}
            own = {name: state.pop(name, None) for name in STATE_FILES}
            save_checkpoint(path, state, adapters=own["adapters"],
                            optimizer_state=own["optimizer"], write_lora=self.write_lora,
                            keep=self.keep, identity=self.identity)
        dist.barrier()
        return path

    def choose(self) -> Path | None:
        """Rank 0 cleans killed saves, verifies the hashes and picks; every rank gets its
        answer (or its error), so all ranks load the same checkpoint and none waits forever."""
        choice = None
        if self.is_main:
            try:
                for _, said in remove_stale_temporaries(self.run_dir):
                    log.warning("%s", said)
                choice = ("path", resume_checkpoint(self.run_dir))
            except CheckpointError as exc:
                choice = ("error", str(exc))
        kind, value = dist.broadcast_object(choice)
        if kind == "error":
            raise CheckpointError(value)
        return value

    def resume(self) -> Path | None:
        """Restore every registered state from the newest intact checkpoint; None if none."""
        path = self.choose()
        if path is not None:
            self.load(path)
        return path

    def load(self, path: str | Path) -> None:
        """Restore every registered state from `path`; a CheckpointError naming the folder
        and the states when one is missing or the folder holds one nobody restores."""
        self.check_identity(Path(path))
        # CPU first: RNG states must stay CPU tensors; the optimizer, adapters and EMA
        # move their tensors to their own device on load.
        ckpt = load_checkpoint(path, map_location="cpu")
        stored = dict(ckpt["state"])
        stored.update({name: ckpt[name] for name in STATE_FILES if ckpt[name] is not None})
        missing = [name for name in self.states if name not in stored]
        unclaimed = [name for name in stored if name not in self.states]
        if missing or unclaimed:
            raise CheckpointError(
                f"{path}: cannot resume this run from it: "
                + "; ".join(part for part in (
                    missing and f"no saved state for {', '.join(missing)}",
                    unclaimed and f"no registered state restores {', '.join(unclaimed)}")
                    if part))
        for name, value in self.states.items():
            try:
                value.load_state_dict(stored[name])
            except (KeyError, ValueError, TypeError, RuntimeError) as exc:
                raise CheckpointError(f"{path}: state {name!r} does not fit this run "
                                      f"({type(exc).__name__}: {exc})") from exc

    def check_identity(self, path: Path) -> None:
        """Refuse a checkpoint recording another run's identity (one line naming both); one
        from before identities resumes with a warning (its folder's config.yaml and inputs.json
        were checked by preflight)."""
        if self.identity is None:
            return
        saved = read_identity(path)
        if saved is None:
            log.warning("%s records no run identity (written before marble recorded one); resuming "
                        "on the run folder's config.yaml and inputs.json", path)
            return
        diffs = identity_differences(saved, self.identity)
        if not diffs:
            return
        if self.adopt:
            log.warning("%s is another run's checkpoint (%s); adopted (%s)", path, "; ".join(diffs), ADOPT_FLAG)
            return
        raise CheckpointError(identity_refusal(path, diffs))
