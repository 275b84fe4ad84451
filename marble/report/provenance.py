"""The report's provenance table: which code and libraries made each run folder and each
evaluation results folder (their `provenance.json`, marble.runtime.provenance)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from marble.report.loading import ReportInputError, RunData
from marble.runtime.provenance import LIBRARIES, PROVENANCE_FILE, read_provenance

COLUMNS = ["kind", "folder", "folders", "commit", "dirty", *LIBRARIES, "python"]
NOT_RECORDED = "not recorded"


def _fields(record: dict | None) -> dict:
    """The printed fields of one record; a folder made before provenance was recorded
    says so in its commit column rather than looking like a clean tree."""
    if record is None:
        return {"commit": NOT_RECORDED}
    git, versions = record.get("git") or {}, record.get("versions") or {}
    commit = git.get("commit")
    return {"commit": commit[:12] if commit else "no git tree",
            "dirty": {True: "yes", False: "no"}.get(git.get("dirty"), "unknown"),
            **{name: versions.get(name) or "-" for name in LIBRARIES},
            "python": record.get("python", "-")}


def _read(folder: Path) -> dict | None:
    try:
        return read_provenance(folder)
    except ValueError as exc:  # one line naming the file, as every report input
        raise ReportInputError(str(exc)) from None


def provenance_table(runs: list[RunData], eval_dir: Path | None) -> pd.DataFrame:
    """One row per run folder; the evaluation folders grouped by identical provenance (a
    paper run has hundreds), each group with its count and its first folder."""
    rows = [{"kind": "run", "folder": run.name, "folders": 1, **_fields(_read(run.path))}
            for run in runs]
    groups: dict[tuple, dict] = {}
    found = sorted(eval_dir.rglob(PROVENANCE_FILE)) if eval_dir and eval_dir.is_dir() else []
    for path in found:
        fields = _fields(_read(path.parent))
        key = tuple(sorted(fields.items()))
        if key not in groups:
            folder = path.parent.relative_to(eval_dir).as_posix()
            groups[key] = {"kind": "eval", "folder": folder, "folders": 0, **fields}
        groups[key]["folders"] += 1
    rows += groups.values()
    return pd.DataFrame(rows, columns=COLUMNS).astype(object).fillna("-")
