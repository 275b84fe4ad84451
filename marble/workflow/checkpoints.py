"""Which checkpoints the workflow evaluates: configured runs' final checkpoints, usable
marble checkpoints found under `eval.scan_dirs`, and `eval.checkpoints` entries (a folder,
`hf:owner/repo[@revision]`, or `base`). Keys are `(name, label)` = the `{run}/{ckpt}` wildcards.

"Usable" is marble.training.checkpoint_format's definition (marker parses, every sha256
matches), the one training resumes by; verdicts are cached per parse (cache=True)."""

from __future__ import annotations

import glob
import os
import re
from pathlib import Path

from marble.assets.hub_ref import is_hub_ref, parse_hub_ref
from marble.training.checkpoint_format import (
    COMPLETE,
    damaged_files,
    is_marble_checkpoint,
)

BASE = "base"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def hub_source(source: str) -> tuple[str, str] | None:
    """(repo id, revision) of an `hf:owner/repo[@revision]` entry (revision default `main`),
    else None."""
    if not is_hub_ref(source):
        return None
    repo, revision = parse_hub_ref(source)
    return repo, revision or "main"


def wildcard_name(text: str, default: str) -> str:
    """`text` as a `{run}`/`{ckpt}` wildcard value (letters, digits, `_.-`; a folder
    named `my lora` is `my_lora`), so any folder name can be evaluated."""
    name = _UNSAFE.sub("_", text)
    return name if name[:1].isalnum() else f"{default}{name}" if name else default


def checkpoint_label(source: str) -> str:
    """The `{ckpt}` folder name of an eval.checkpoints entry."""
    if source == BASE:
        return BASE
    hub = hub_source(source)
    if hub:
        return _UNSAFE.sub("_", f"hub-{hub[1]}")
    return wildcard_name(Path(source).name, "lora")


def named_checkpoints(entries: dict) -> dict:
    """{(name, label): source} from eval.checkpoints; a null entry is a row an overlay
    dropped (not evaluated with this config), not a folder named `None`."""
    return {(name, checkpoint_label(str(source))): str(source)
            for name, source in entries.items() if source is not None}


def hub_loras(entries: dict) -> dict:
    """{name: (repo, revision)} of the hub LoRAs in eval.checkpoints (null entries skipped)."""
    return {name: hub_source(str(s)) for name, s in entries.items()
            if s is not None and hub_source(str(s))}


def _run_dir_of(folder: Path) -> Path:
    return folder.parent.parent if folder.parent.name == "checkpoints" else folder.parent


def scanned_checkpoints(scan_dirs: list) -> dict:
    """{(run, ckpt): folder} of usable marble checkpoints under `scan_dirs`.

    Globbed at every parse, so re-running a target picks up checkpoints saved since; a
    damaged one (a kill mid-copy, a changed file) is left out, never scored. Two
    folders with one run name (e.g. two scan dirs, each holding a `marble` run) get distinct
    names: the second is `<run>-<parent folder>` (never silently dropped).
    """
    found: dict = {}
    for root in scan_dirs:
        pattern = f"{glob.escape(str(root))}/**/checkpoint-*/{COMPLETE}"
        for marker in sorted(glob.glob(pattern, recursive=True)):
            folder = Path(marker).parent
            if not is_usable(folder):
                continue
            run_dir = _run_dir_of(folder)
            name = wildcard_name(run_dir.name, "run")
            same = found.get((name, folder.name))
            # One of our own runs scanned through another spelling (absolute path).
            if same is not None and os.path.samefile(same, folder):
                continue
            if same is not None:
                base = _UNSAFE.sub("_", run_dir.parent.name) or "root"
                name, n = f"{name}-{base}", 2
                while (name, folder.name) in found:
                    name, n = f"{wildcard_name(run_dir.name, 'run')}-{base}{n}", n + 1
            found[(name, folder.name)] = str(folder)
    return found


def merge_catalogue(final: dict, *others: dict) -> dict:
    """Every checkpoint the workflow knows; a `(name, label)` naming two folders is an error."""
    catalogue = dict(final)
    for extra in others:
        for key, folder in extra.items():
            old = catalogue.get(key, folder)
            if old != folder and not (os.path.exists(old) and os.path.exists(folder)
                                      and os.path.samefile(old, folder)):
                raise ValueError(f"config: checkpoint {key[0]}/{key[1]} names two folders: "
                                 f"{old} and {folder}; rename one in eval.checkpoints")
            catalogue.setdefault(key, folder)
    return catalogue


def is_usable(folder: str | os.PathLike) -> bool:
    """A usable marble checkpoint folder (hash verdicts cached for this process)."""
    return os.path.isdir(folder) and not damaged_files(folder, cache=True)


def checkpoint_input(folder: str) -> str:
    """The input an evaluation of a local checkpoint folder waits for: its marker when it is
    a marble checkpoint (which must be usable: else an error naming what is damaged), the
    folder itself for a bare LoRA (peft or diffusers)."""
    if is_marble_checkpoint(folder) and os.path.exists(os.path.join(folder, COMPLETE)):
        damaged = damaged_files(folder, cache=True)
        if damaged:
            raise ValueError(f"checkpoint {folder} is damaged: {', '.join(damaged)}; "
                             "restore it or remove it from eval.checkpoints")
        return os.path.join(folder, COMPLETE)
    return folder
