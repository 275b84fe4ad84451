"""Atomic checkpoints and exact resume.

Layout of `RUN/checkpoints/checkpoint-{step:06d}/`:
  lora/                  diffusers-format EMA weights of "default" (`pipe.load_lora_weights`)
  adapters.safetensors   online "default" and "old" adapter states (keys `<adapter>::<name>`)
  optimizer.pt           AdamW state_dict
  state.pt               step, epoch, RNG states, sampler, balancer, EMA, GradScaler
  COMPLETE               written last, after every file and folder is fsynced; JSON:
                         {"format": 2, "sha256": {relative path: hex digest}} of every
                         other file (marble.training.checkpoint_format: the one definition
                         of a usable checkpoint; a bad marker makes the folder damaged)

The folder is assembled under a temporary name and renamed into place, so a crash
leaves either no checkpoint or a complete one (and a `.checkpoint-*.tmp` folder that the
next start removes). A file damaged later (a truncated copy, a full disk on a sync, bit
rot) or an empty marker is caught on resume: `resume_checkpoint` warns naming the file
and falls back to the previous usable checkpoint. Everything in
the .pt files is tensors and primitives, so they load with `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from marble.runtime.io import atomic_path, fsync_tree
from marble.training.checkpoint_format import (  # noqa: F401  (re-exported: one definition)
    COMPLETE,
    MARKER_FORMAT,
    CheckpointError,
    checkpoint_name,
    checkpoint_root,
    damaged_files,
    file_hashes,
    list_checkpoints,
    marker_text,
    remove_stale_temporaries,
    usable_checkpoints,
)

log = logging.getLogger(__name__)


def checkpoint_dir(run_dir: str | Path, step: int) -> Path:
    return checkpoint_root(run_dir) / checkpoint_name(step)


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
) -> Path:
    """Write one checkpoint folder atomically, then prune to the newest `keep`.

    `write_lora(folder)` writes the diffusers-format LoRA (the trainer passes a closure
    over `save_lora_diffusers` with the EMA state).
    """
    ckpt_dir = Path(ckpt_dir)
    with atomic_path(ckpt_dir) as tmp:
        tmp.mkdir(parents=True)
        if write_lora is not None:
            write_lora(tmp / "lora")
        if adapters is not None:
            save_file(flatten_adapters(adapters), str(tmp / "adapters.safetensors"))
        if optimizer_state is not None:
            torch.save(optimizer_state, tmp / "optimizer.pt")
        torch.save(state, tmp / "state.pt")
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

    out["state"] = _read(ckpt_dir / "state.pt", read_pt)
    opt = ckpt_dir / "optimizer.pt"
    out["optimizer"] = _read(opt, read_pt) if opt.is_file() else None
    ad = ckpt_dir / "adapters.safetensors"
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
