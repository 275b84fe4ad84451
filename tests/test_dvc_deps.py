"""dvc.yaml's code dependencies cover what each stage's commands import.

A stage reruns only when one of its `deps` changes, so a module a stage's command imports
but no dep covers is a change DVC would not see (stale results under a new commit). The
imports are the graph of tests/test_import_graph.py (function-level and registry imports
included), closed transitively from the modules each stage's rules run.
"""

from __future__ import annotations

import yaml

from test_import_graph import ROOT, module_files, scan

# The modules each stage's rules run (workflow/rules/*.smk commands; common.smk's imports).
STAGE_ENTRIES = {
    "prepare": ["marble.data.cli", "marble.assets.download", "marble.models.cli", "marble.config",
                "marble.workflow"],
    "train": ["marble.train", "marble.config", "marble.workflow"],
    "evaluate": ["marble.evaluate", "marble.evaluation.summary", "marble.config", "marble.workflow"],
    "report": ["marble.report", "marble.tools.bench", "marble.config"],
}
DATA_OF = {"marble.config": "marble/presets"}  # files a module reads beside its code


def closure(edges: dict[str, set[str]], starts: list[str]) -> set[str]:
    seen, todo = set(), [s for s in starts if s in edges]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(edges[module])
    return seen


def covered(rel: str, deps: list[str]) -> bool:
    return any(rel == d or rel.startswith(d.rstrip("/") + "/") for d in deps)


def uncovered(stage: str, deps: list[str]) -> list[str]:
    edges, _ = scan(ROOT, "marble")
    files = module_files(ROOT, "marble")
    needed = set()
    for module in closure(edges, STAGE_ENTRIES[stage]):
        needed.add(files[module].relative_to(ROOT).as_posix())
        if module in DATA_OF:
            needed.add(DATA_OF[module])
    return sorted(rel for rel in needed if not covered(rel, deps))


def test_every_stage_depends_on_the_code_it_runs():
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    assert set(STAGE_ENTRIES) <= set(stages)
    missing = {stage: uncovered(stage, [d for d in stages[stage].get("deps", []) if isinstance(d, str)])
               for stage in STAGE_ENTRIES}
    missing = {stage: files for stage, files in missing.items() if files}
    assert not missing, f"dvc.yaml deps miss code their stage imports: {missing}"


def test_the_check_sees_a_missing_dependency():
    assert covered("marble/data/records.py", ["marble/data"])
    assert not covered("marble/data_extra.py", ["marble/data"])
    assert "marble/runtime/seeds.py" in uncovered("evaluate", ["marble/evaluate.py", "marble/evaluation"])
