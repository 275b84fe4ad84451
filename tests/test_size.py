"""tests/size.py (`make stats`, CI's size line) counts each part in its own bucket."""

from __future__ import annotations

from size import measure, one_line


def _tree(root, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def test_each_part_counts_its_own_lines_files_words_and_dependencies(tmp_path):
    _tree(tmp_path, {
        "marble/__init__.py": "a = 1\nb = 2\n",
        "marble/experiments/claim.py": "x = 1\n",  # the laboratory, not the product
        "marble/experiments/deep/more.py": "y = 1\nz = 2\nw = 3\n",
        "tests/test_a.py": "def test():\n    pass\n",
        "tests/beds/mirror.py": "m = 1\n",  # a test bed, not a test
        "docs/" "notes.md": "three words here\n",  # split: not a doc the tree cites
        "README.md": "two words\n",
        "pyproject.toml": '[project]\ndependencies = ["torch>=2.1", "numpy"]\n'
                          '[project.optional-dependencies]\nx = ["torch", "open-clip-torch>=2"]\n',
    })
    m = measure(tmp_path)
    assert m["python"] == {"product": {"files": 1, "lines": 2}, "experiments": {"files": 2, "lines": 4},
                           "test beds": {"files": 1, "lines": 1}, "tests": {"files": 1, "lines": 2}}
    assert (m["docs_words"], m["dependencies"], m["optional_dependencies"]) == (5, 2, 1)
    assert one_line(m).startswith("size: product 2 lines / 1 files, experiments 4 lines / 2 files")
