"""Provenance (marble.runtime.provenance): git commit and dirty flag of a real git tree,
library versions, one atomic file; the report's table of it. Torch-free, under a second."""

from __future__ import annotations

import json
import subprocess
from importlib import metadata

import pytest

from marble.report.loading import ReportInputError, RunData
from marble.report.provenance import NOT_RECORDED, provenance_table
from marble.runtime import provenance as prov


def _git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def test_git_state_names_the_commit_and_sees_uncommitted_changes(tmp_path):
    repo = tmp_path / "src"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "a.py").write_text("x = 1\n")
    _git(repo, "add", "a.py")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    assert prov.git_state(repo) == {"commit": _git(repo, "rev-parse", "HEAD"), "dirty": False}
    (repo / "a.py").write_text("x = 2\n")
    assert prov.git_state(repo)["dirty"] is True
    _git(repo, "checkout", "-q", "a.py")
    (repo / "new.py").write_text("")  # an untracked module changes the code too
    assert prov.git_state(repo)["dirty"] is True
    # No git tree (an installed wheel): unknown, never "clean".
    (tmp_path / "plain").mkdir()
    assert prov.git_state(tmp_path / "plain") == {"commit": None, "dirty": None}
    # A folder inside someone else's work tree (a wheel in a venv under a checkout): not its code.
    (repo / ".venv/site-packages").mkdir(parents=True)
    assert prov.git_state(repo / ".venv/site-packages") == {"commit": None, "dirty": None}


def test_write_provenance_records_versions_and_config(tmp_path):
    path = prov.write_provenance(tmp_path, {"train": {"seed": 3}})
    assert path == tmp_path / "provenance.json"
    record = json.loads(path.read_text())
    assert record["config"] == {"train": {"seed": 3}}
    assert record["versions"]["torch"] == metadata.version("torch")
    assert set(record["versions"]) == set(prov.LIBRARIES)
    assert set(record["git"]) == {"commit", "dirty"}
    assert [p.name for p in tmp_path.iterdir()] == ["provenance.json"]  # no temporary left
    assert prov.read_provenance(tmp_path) == record


def _run(path, name):
    import pandas as pd

    path.mkdir(parents=True)
    return RunData(name, path, {}, pd.DataFrame({"step": []}))


def test_the_report_table_prints_runs_and_groups_eval_folders(tmp_path):
    recorded, old = _run(tmp_path / "runs/a", "a"), _run(tmp_path / "runs/b", "b")
    prov.write_provenance(recorded.path, {})
    for ds in ("geneval", "ocr"):
        (tmp_path / "eval/a/checkpoint-000002" / ds).mkdir(parents=True)
        prov.write_provenance(tmp_path / "eval/a/checkpoint-000002" / ds, {"ds": ds})
    table = provenance_table([recorded, old], tmp_path / "eval")
    assert list(table["kind"]) == ["run", "run", "eval"]
    here = prov.git_state()
    assert table.loc[0, "commit"] == (here["commit"][:12] if here["commit"] else "no git tree")
    assert table.loc[0, "torch"] == metadata.version("torch")
    assert table.loc[1, "commit"] == NOT_RECORDED  # made before provenance was recorded
    assert table.loc[2, "folders"] == 2 and table.loc[2, "folder"] == "a/checkpoint-000002/geneval"
    (recorded.path / "provenance.json").write_text("{")
    with pytest.raises(ReportInputError, match=r"runs/a/provenance.json: not JSON"):
        provenance_table([recorded], None)
