"""The checkpoint format: folder layout, the COMPLETE marker, what is usable. Torch-free.

Resume (marble.training.checkpoint, whose CheckpointManager writes and reads this layout),
`marble evaluate --checkpoint_path`, the workflow's input functions
(marble.workflow.checkpoints, imported when Snakemake parses the Snakefile, so no torch
here) and the report all ask this module.

Layout of `RUN/checkpoints/checkpoint-{step:06d}/` (the names below are the constants):
  lora/                  LORA_DIR: diffusers-format EMA weights of "default"
                         (`pipe.load_lora_weights`); an export, never read by resume
  adapters.safetensors   ADAPTERS_FILE: the registered state "adapters" (online "default"
                         and "old" adapters, keys `<adapter>::<name>`)
  optimizer.pt           OPTIMIZER_FILE: the registered state "optimizer" (AdamW state_dict)
  state.pt               STATE_FILE: every other registered state by name (step, epoch,
                         rng, sampler, balancer, ema, scaler, ...), tensors and primitives
                         only, so it loads with `torch.load(weights_only=True)`
  identity.json          IDENTITY_FILE: the run's identity (marble.training.run_dir.run_identity:
                         config digest, base and table fingerprints, seed); resume refuses a
                         checkpoint of another run, evaluation one of another base. Checkpoints
                         written before it have none (they resume: the run folder's config.yaml
                         and inputs.json vouch for them)
  COMPLETE               written last, after every file and folder is fsynced

A checkpoint is *usable* when its `COMPLETE` marker parses as
{"format": 2, "sha256": {relative path: hex digest}} naming at least one file, and every
file it names is present with that sha256. Anything else is *damaged*: an empty or
unparsable marker is never taken as "older marble, unverified", because an empty marker
is exactly what a node crash leaves of an unsynced write.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from pathlib import Path

from marble.runtime.io import sha256_file

CHECKPOINTS = "checkpoints"
COMPLETE = "COMPLETE"
LORA_DIR = "lora"
ADAPTERS_FILE = "adapters.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
STATE_FILE = "state.pt"
IDENTITY_FILE = "identity.json"
# The registered states that have a file of their own; every other one is a key of STATE_FILE.
STATE_FILES = {"adapters": ADAPTERS_FILE, "optimizer": OPTIMIZER_FILE}
MARKER_FORMAT = 2
CKPT_RE = re.compile(r"^checkpoint-(\d+)$")
# What marble.runtime.io.atomic_path leaves behind when a save is killed.
_STALE_TMP_RE = re.compile(r"^\.checkpoint-\d+\..*\.tmp$")
_STALE_OLD_RE = re.compile(r"^\.(checkpoint-\d+)\.old$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
log = logging.getLogger(__name__)


class CheckpointError(RuntimeError, ValueError):
    """No usable checkpoint where one is needed; the message names the folder.

    Both a RuntimeError (what resume raised) and a ValueError (what `--checkpoint_path`
    raised), so an `except` written for either catches every checkpoint failure.
    """


def checkpoint_name(step: int) -> str:
    """The folder name of the checkpoint after optimizer step `step`."""
    return f"checkpoint-{int(step):06d}"


def checkpoint_step(name: str) -> int | None:
    """The step of a `checkpoint-N` folder name, else None."""
    match = CKPT_RE.match(name)
    return int(match.group(1)) if match else None


def checkpoint_root(run_dir: str | Path) -> Path:
    return Path(run_dir) / CHECKPOINTS


def checkpoint_dir(run_dir: str | Path, step: int) -> Path:
    """`RUN/checkpoints/checkpoint-{step:06d}`: where the checkpoint after `step` lives."""
    return checkpoint_root(run_dir) / checkpoint_name(step)


def file_hashes(ckpt_dir: str | Path) -> dict[str, str]:
    """sha256 of every file under a checkpoint folder but the marker, by relative path."""
    root = Path(ckpt_dir)
    return {p.relative_to(root).as_posix(): sha256_file(p)
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != COMPLETE}


def marker_text(ckpt_dir: str | Path) -> str:
    """The COMPLETE marker of a fully written folder (hashes of every file in it)."""
    return json.dumps({"format": MARKER_FORMAT, "sha256": file_hashes(ckpt_dir)}, indent=1) + "\n"


def read_marker(ckpt_dir: str | Path) -> dict[str, str]:
    """{relative path: sha256} recorded by the folder's marker; CheckpointError naming
    the marker when it is missing, empty, unparsable or records no hashes."""
    marker = Path(ckpt_dir) / COMPLETE
    try:
        data = json.loads(marker.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{marker}: missing (the save never finished)") from None
    except (OSError, ValueError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise CheckpointError(f"{marker}: unreadable or not JSON ({exc})") from None
    hashes = data.get("sha256") if isinstance(data, dict) else None
    if (not isinstance(hashes, dict) or not hashes or data.get("format") != MARKER_FORMAT
            or not all(isinstance(k, str) and isinstance(v, str) and _HEX64.match(v)
                       for k, v in hashes.items())):
        raise CheckpointError(f"{marker}: not a format-{MARKER_FORMAT} marker with the sha256 "
                              "of every file")
    return hashes


def read_identity(ckpt_dir: str | Path) -> dict | None:
    """The run identity a checkpoint records, None for one written before identities; a
    CheckpointError naming the file when it is not a JSON object."""
    path = Path(ckpt_dir) / IDENTITY_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: unreadable or not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: not a JSON object (a run identity)")
    return data


# Hashing a paper-size checkpoint takes seconds and the workflow asks many times per
# parse: with cache=True a verdict is kept per process while no file in the folder changed
# (size, mtime, inode). Opt-in: an in-place edit within one clock tick keeps the mtime, so
# resume and evaluation always hash.
_VERDICTS: dict[tuple, list[str]] = {}


def _fingerprint(ckpt_dir: Path) -> tuple:
    stats = []
    for path in sorted(ckpt_dir.rglob("*")):
        st = path.stat()
        stats.append((path.as_posix(), st.st_size, st.st_mtime_ns, st.st_ino))
    return (ckpt_dir.resolve().as_posix(), tuple(stats))


def damaged_files(ckpt_dir: str | Path, cache: bool = False) -> list[str]:
    """What makes a checkpoint folder unusable ([] when it is usable): a bad marker, or
    each file the marker names that is missing or differs from its sha256."""
    ckpt_dir = Path(ckpt_dir)
    try:
        key = _fingerprint(ckpt_dir) if cache else None
    except OSError as exc:
        return [f"{ckpt_dir}: unreadable ({exc.strerror})"]
    if key in _VERDICTS:
        return list(_VERDICTS[key])
    try:
        hashes = read_marker(ckpt_dir)
    except CheckpointError as exc:
        bad = [f"{COMPLETE} ({str(exc).split(': ', 1)[1]})"]
    else:
        bad = []
        for rel, digest in sorted(hashes.items()):
            path = ckpt_dir / rel
            if not path.is_file():
                bad.append(f"{rel} (missing)")
            elif sha256_file(path) != digest:
                bad.append(f"{rel} (sha256 differs from {COMPLETE})")
    if key is not None:
        _VERDICTS[key] = bad
    return list(bad)


def is_usable(ckpt_dir: str | Path, cache: bool = False) -> bool:
    return Path(ckpt_dir).is_dir() and not damaged_files(ckpt_dir, cache)


def is_marble_checkpoint(folder: str | Path) -> bool:
    """A folder marble's trainer wrote (or began to write): it must then be usable to be
    used; a bare LoRA folder (peft, diffusers, the reference's `<ckpt>/lora`) is not one."""
    folder = Path(folder)
    return (folder / COMPLETE).exists() or (folder / STATE_FILE).exists() or (
        checkpoint_step(folder.name) is not None and folder.parent.name == CHECKPOINTS)


def list_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """Checkpoint folders of a run that have a COMPLETE marker (usable or not), oldest first."""
    root = checkpoint_root(run_dir)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        step = checkpoint_step(child.name)
        if step is not None and child.is_dir() and (child / COMPLETE).is_file():
            found.append((step, child))
    return sorted(found)


def usable_checkpoints(run_dir: str | Path, warn: bool = True,
                       cache: bool = False) -> list[tuple[int, Path]]:
    """The usable checkpoints of a run, oldest first; each damaged one is a warning
    naming its folder and what is wrong."""
    out = []
    for step, path in list_checkpoints(run_dir):
        damaged = damaged_files(path, cache)
        if not damaged:
            out.append((step, path))
        elif warn:
            log.warning("%s is damaged: %s; not using it", path, ", ".join(damaged))
    return out


def latest_usable(run_dir: str | Path) -> Path | None:
    """The newest usable checkpoint of a run folder, or None."""
    found = usable_checkpoints(run_dir)
    return found[-1][1] if found else None


def remove_stale_temporaries(run_dir: str | Path) -> list[tuple[Path, str]]:
    """Clean what killed saves left in `checkpoints/`: `.checkpoint-*.tmp` folders are
    removed; a `.checkpoint-N.old` (a kill between the two renames of an overwrite) is
    removed when `checkpoint-N` exists, else renamed back. Returns each leftover with a
    sentence saying what was done to it (a restored `.old` was logged "removed" before).
    Only the one trainer of a run folder may call it (train_launch.sh's lock)."""
    root = checkpoint_root(run_dir)
    touched = []
    for child in sorted(root.iterdir()) if root.is_dir() else []:
        old = _STALE_OLD_RE.match(child.name)
        if _STALE_TMP_RE.match(child.name):
            shutil.rmtree(child, ignore_errors=True)
            said = f"removed {child} (left by a killed checkpoint save)"
        elif old and (root / old.group(1)).exists():
            shutil.rmtree(child, ignore_errors=True)
            said = f"removed {child} ({old.group(1)} exists: a save killed after its second rename)"
        elif old:
            os.replace(child, root / old.group(1))
            said = (f"restored {root / old.group(1)} from {child} (a save killed between the "
                    "two renames of its overwrite)")
        else:
            continue
        touched.append((child, said))
    return touched
