"""Provenance of a run or results folder: which code, which libraries, which config.

One file, `provenance.json`, written atomically by `write_provenance`: the git commit of
the marble source tree and whether it had uncommitted changes, the versions of the
libraries that decide the numbers, the Python version, and the resolved config. The
trainer writes it into every run folder, `marble evaluate` into every results folder, and
the report prints it. Torch-free: versions are read from the installed distributions'
metadata, so nothing heavy is imported to record them.
"""

from __future__ import annotations

import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

from marble.runtime.io import read_json_object, write_json

PROVENANCE_FILE = "provenance.json"
# The libraries whose version can change a result (sampling, LoRA, text encoders).
LIBRARIES = ("marble", "torch", "diffusers", "transformers", "peft")
# The source tree whose commit is recorded: the one marble is imported from (an editable
# install or a checkout on PYTHONPATH), not the working directory of the command.
SOURCE_ROOT = Path(__file__).resolve().parents[2]


def library_versions() -> dict[str, str | None]:
    """{distribution: version}; None for one that is not installed."""
    out: dict[str, str | None] = {}
    for name in LIBRARIES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_state(root: str | Path = SOURCE_ROOT) -> dict[str, Any]:
    """{"commit": sha or None, "dirty": bool or None} of the git work tree at `root`.

    None (not False) when `root` is no git work tree or git is missing: an installed
    wheel has no commit, and "clean" would be a claim nobody checked. Dirty counts
    untracked files too (a new module changes the code as much as an edit).
    """
    def git(*args: str) -> str | None:
        try:
            proc = subprocess.run(["git", "-C", str(root), *args], capture_output=True,
                                  text=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return proc.stdout if proc.returncode == 0 else None

    # `root` must be the work tree's top, not a folder inside one: marble installed as a wheel
    # into a venv inside some checkout would otherwise record that checkout's commit.
    top = git("rev-parse", "--show-toplevel")
    commit = git("rev-parse", "HEAD")
    if top is None or commit is None or Path(top.strip()).resolve() != Path(root).resolve():
        return {"commit": None, "dirty": None}
    status = git("status", "--porcelain")
    return {"commit": commit.strip(), "dirty": None if status is None else bool(status.strip())}


def provenance(config: Any) -> dict[str, Any]:
    """The provenance record of a folder made with `config` (a JSON-able resolved config).

    No timestamp and no host: two runs of the same code and config record the same bytes
    (a DVC-tracked results folder stays reproducible).
    """
    return {"git": git_state(), "versions": library_versions(),
            "python": platform.python_version(), "config": config}


def write_provenance(folder: str | Path, config: Any) -> Path:
    """Write `folder/provenance.json` atomically; returns its path."""
    path = Path(folder) / PROVENANCE_FILE
    write_json(path, provenance(config))
    return path


def read_provenance(folder: str | Path) -> dict[str, Any] | None:
    """A folder's provenance record; None when it has none (made before marble recorded
    one); a ValueError naming the file when it is not a JSON object."""
    return read_json_object(Path(folder) / PROVENANCE_FILE)
