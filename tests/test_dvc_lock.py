"""dvc.lock is current: no stage's code, workflow files or params changed without the lock.

The check a package manager does for its lock file. `dvc status` compares every stage's
dependencies with the hashes dvc.lock recorded when `dvc repro` last ran; a fresh clone has
no data, so data dependencies show as deleted and outputs as missing: those are not the
lock's fault. What must not show is a committed file (code, rules, schemas) or a param whose
hash differs from the lock's: then `dvc repro` on a fresh clone would not reproduce the
outputs the lock describes. The fix is `make lock` (`dvc repro`, then commit dvc.lock).
"""

from __future__ import annotations

import json
import shutil
import subprocess

from test_workflow_lib import ROOT, copy_workflow, dvc


def stale_dependencies(status: dict, tracked: set[str]) -> dict[str, list[str]]:
    """{stage: ["path: how"]} for dependencies that are committed files and changed."""
    stale: dict[str, list[str]] = {}
    for stage, entries in status.items():
        for entry in entries:
            if not isinstance(entry, dict):  # "changed command", "always changed"
                stale.setdefault(stage, []).append(str(entry))
                continue
            for path, how in entry.get("changed deps", {}).items():
                if isinstance(how, dict):  # params: {key: "modified"}
                    stale.setdefault(stage, []).extend(f"{path}:{key}: {v}" for key, v in how.items())
                elif path in tracked or any(t.startswith(path.rstrip("/") + "/") for t in tracked):
                    stale.setdefault(stage, []).append(f"{path}: {how}")
    return stale


def test_stale_dependencies_tells_code_from_data():
    status = {
        "train": [{"changed deps": {"data/models/tiny": "deleted", "marble": "modified",
                                    "config.yaml": {"runs": "modified"}}},
                  {"changed outs": {"results/runs": "not in cache"}}],
        "report": [{"changed outs": {"results/report": "deleted"}}],
    }
    tracked = {"marble/train.py", "config.yaml"}
    assert stale_dependencies(status, tracked) == {
        "train": ["marble: modified", "config.yaml:runs: modified"]}


def test_dvc_lock_knows_the_committed_code(tmp_path):
    work = copy_workflow(tmp_path / "w", config=None)
    shutil.copy2(ROOT / "dvc.lock", work / "dvc.lock")
    tracked = set(subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                                 check=True).stdout.split())
    status = json.loads(dvc(["status", "--json"], work).stdout or "{}")
    stale = stale_dependencies(status, tracked)
    assert not stale, ("dvc.lock is stale (run `make lock`, i.e. `dvc repro`, and commit dvc.lock):\n"
                       + "\n".join(f"  {stage}: {', '.join(items)}" for stage, items in stale.items()))
