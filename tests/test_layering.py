"""The layer fence (docs/layers.yaml) catches an upward import, and ARCHITECTURE shows the file.

tests/test_import_graph.py runs the fence on the real tree; here it is proven to bite: an
upward import injected into a scratch copy of marble/ (module- and function-level) fails it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from layering import (ARCHITECTURE, LayerFileError, doc_section, layer_of, load_layers,
                      render_table)
from test_import_graph import ROOT, problems, scan_with_lines

LAYERS = load_layers()


def fresh_problems(root: Path) -> list[str]:
    scan_with_lines.cache_clear()  # the scan is cached per folder; the scratch copy changes
    return problems(root, "marble", LAYERS)


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")


def test_architecture_shows_the_layer_file():
    section = doc_section(ARCHITECTURE.read_text(encoding="utf-8"))
    assert section == render_table(LAYERS), "run: python tests/layering.py --write-doc"


@pytest.mark.parametrize("module, layer", [
    ("marble.config", 1), ("marble.maths.nft", 2), ("marble.runtime.io", 3),
    ("marble.data.records", 7), ("marble.data.cli", 14), ("marble.report.cli", 14),
    ("marble.report.table1", 13), ("marble.tools.mutants", 15), ("marble.cli", 16),
    ("marble.train", 14), ("marble.training.trainer", 10), ("marble.balancers.solve", 8),
    ("marble.balance", 9), ("marble.experiments.claim_cli", 17), ("marble.experiments", 17),
])
def test_a_module_belongs_to_its_most_specific_entry(module, layer):
    assert layer_of(module, LAYERS).rank == layer


# (file, appended text, importer, target): the three first, each of which passed every
# test before the fence; then a component to its right, a loop to a tool, a registry string
# naming a command line.
INJECTED = [
    ("marble/maths/nft.py", "def injected():\n    from marble.runtime import io\n",
     "marble.maths.nft", "marble.runtime.io"),
    ("marble/config.py", "import marble.runtime.io\n", "marble.config", "marble.runtime.io"),
    ("marble/evaluation/results.py", "def injected():\n    import marble.train\n",
     "marble.evaluation.results", "marble.train"),
    ("marble/rewards/base.py", "from marble.data import records\n", "marble.rewards.base",
     "marble.data.records"),
    ("marble/training/trainer.py", "def injected():\n    from marble.tools import bench\n",
     "marble.training.trainer", "marble.tools.bench"),
    ("marble/workflow/runs.py", "ENTRY = 'marble.report.cli:main'\n", "marble.workflow.runs",
     "marble.report.cli"),
]


def test_each_injected_upward_import_fails_and_nothing_else(tmp_path):
    """One scan of a scratch copy of marble/ with every injection (a scan costs ~1 s): exactly
    the injected imports are findings, each at its own file:line, so the fence bites on each
    and the copy is otherwise clean; a new package in no layer fails too."""
    shutil.copytree(ROOT / "marble", tmp_path / "marble",
                    ignore=shutil.ignore_patterns("__pycache__", "*.yaml", "*.css", "*.html"))
    expected = set()
    for file, text, importer, target in INJECTED:
        path = tmp_path / file
        original = path.read_text(encoding="utf-8")
        path.write_text(original + "\n\n" + text, encoding="utf-8")
        lineno = original.count("\n") + 2 + text.count("\n")  # the appended import's line
        expected.add((f"{file}:{lineno}", importer, target))
    _write(tmp_path, {"marble/newpkg/__init__.py": ""})
    found = fresh_problems(tmp_path)
    assert "module in no layer: marble.newpkg (add it to layers.yaml)" in found
    upward = {(f.split(": ")[1], f.split(": ")[2].split(" (")[0], f.split(" -> ")[1].split(" (")[0])
              for f in found if f.startswith("upward import:")}
    assert expected <= upward, found  # each injection caught, at its line, naming its target
    # and nothing else: every upward finding is one of the injected lines (the extra ones are
    # the package __init__s those lines also initialise)
    assert {where for where, _, _ in upward} == {where for where, _, _ in expected}, found


def test_a_nothing_layer_may_not_use_a_lower_one(tmp_path):
    """`uses: nothing` bars the layers below too: runtime (3) may not use maths (2)."""
    _write(tmp_path, {"marble/__init__.py": "", "marble/maths/__init__.py": "",
                      "marble/runtime/__init__.py": "from marble import maths\n"})
    found = fresh_problems(tmp_path)
    assert found == ["upward import: marble/runtime/__init__.py:1: marble.runtime (3. runtime (what "
                     "every loop runs on)) -> marble.maths (2. pure maths (no models, no files, no "
                     "processes))"], found


@pytest.mark.parametrize("text, message", [
    ("- {name: a, modules: [x]}\n", "layer 1: needs exactly the keys name, modules, uses"),
    ("- {name: a, modules: [x], uses: above}\n", "layer 1: uses must be one of"),
    ("- {name: a, modules: [x], uses: below}\n- {name: b, modules: [x], uses: below}\n",
     "layer 2: x is already in an earlier layer"),
    ("{}\n", "expected a list of layers"),
])
def test_a_malformed_layer_file_is_one_line(tmp_path, text, message):
    path = tmp_path / "layers.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(LayerFileError, match=message):
        load_layers(path)
