"""Which checkpoints the workflow evaluates: configured runs' final checkpoints, complete
marble checkpoints found under `eval.scan_dirs`, and `eval.checkpoints` entries (a folder,
`hf:owner/repo[@revision]`, or `base`). Keys are `(name, label)` = the `{run}/{ckpt}` wildcards."""

from __future__ import annotations

import glob
import os
import re
from pathlib import Path

from marble.assets.hub_ref import is_hub_ref, parse_hub_ref

BASE = "base"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def hub_source(source: str) -> tuple[str, str] | None:
    """(repo id, revision) of an `hf:owner/repo[@revision]` entry (revision default `main`),
    else None."""
    if not is_hub_ref(source):
        return None
    repo, revision = parse_hub_ref(source)
    return repo, revision or "main"


def checkpoint_label(source: str) -> str:
    """The `{ckpt}` folder name of an eval.checkpoints entry."""
    if source == BASE:
        return BASE
    hub = hub_source(source)
    if hub:
        return _UNSAFE.sub("_", f"hub-{hub[1]}")
    return Path(source).name or "lora"


def named_checkpoints(entries: dict) -> dict:
    """{(name, label): source} from eval.checkpoints."""
    return {(name, checkpoint_label(str(source))): str(source) for name, source in entries.items()}


def hub_loras(entries: dict) -> dict:
    """{name: (repo, revision)} of the hub LoRAs in eval.checkpoints."""
    return {name: hub_source(str(s)) for name, s in entries.items() if hub_source(str(s))}


def _run_dir_of(folder: Path) -> Path:
    return folder.parent.parent if folder.parent.name == "checkpoints" else folder.parent


def scanned_checkpoints(scan_dirs: list) -> dict:
    """{(run, ckpt): folder} of complete marble checkpoints under `scan_dirs`.

    Globbed at every parse, so re-running a target picks up checkpoints saved since. Two
    folders with one run name (e.g. two scan dirs, each holding a `marble` run) get distinct
    names: the second is `<run>-<parent folder>` (never silently dropped).
    """
    found: dict = {}
    for root in scan_dirs:
        for marker in sorted(glob.glob(f"{root}/**/checkpoint-*/COMPLETE", recursive=True)):
            folder = Path(marker).parent
            run_dir = _run_dir_of(folder)
            name = run_dir.name
            same = found.get((name, folder.name))
            # One of our own runs scanned through another spelling (absolute path).
            if same is not None and os.path.samefile(same, folder):
                continue
            if same is not None:
                base = _UNSAFE.sub("_", run_dir.parent.name) or "root"
                name, n = f"{name}-{base}", 2
                while (name, folder.name) in found:
                    name, n = f"{run_dir.name}-{base}{n}", n + 1
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
