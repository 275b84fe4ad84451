"""The project's size where a developer sees it every day (`make stats`, one line of CI's output):
lines and files of the product, the experiments, the test beds and the tests, words of the
docs, and the dependency count, so that growth is a decision, not a drift.

    python tests/size.py           # a table
    python tests/size.py --line    # one line (CI)
    python tests/size.py --json    # the numbers

Standard library only (no marble, no torch): it reads files, so it runs in a second.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = Path("marble/experiments")  # the laboratory (docs/layers.yaml's top layer)
BEDS = Path("tests/beds")  # mirrors, replicas, fake servers: test infrastructure
WORD = re.compile(r"\S+")


@dataclass(frozen=True)
class Part:
    files: int
    lines: int


def _inside(path: Path, folder: Path) -> bool:
    return folder in path.parents


def python_parts(root: Path = ROOT) -> dict[str, Part]:
    """product / experiments / test beds / tests: .py files and their lines. The product is
    marble/ without marble/experiments; the tests are tests/ without tests/beds."""
    buckets: dict[str, list[int]] = {"product": [], "experiments": [], "test beds": [], "tests": []}
    for top in ("marble", "tests"):
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root)
            if top == "marble":
                name = "experiments" if _inside(rel, EXPERIMENTS) else "product"
            else:
                name = "test beds" if _inside(rel, BEDS) else "tests"
            buckets[name].append(len(path.read_text(encoding="utf-8").splitlines()))
    return {name: Part(len(lines), sum(lines)) for name, lines in buckets.items()}


def docs_words(root: Path = ROOT) -> int:
    """Words of docs/*.md and README.md (what a reader reads)."""
    paths = sorted((root / "docs").glob("*.md")) + [root / "README.md"]
    return sum(len(WORD.findall(p.read_text(encoding="utf-8"))) for p in paths if p.is_file())


def dependencies(root: Path = ROOT) -> tuple[int, int] | tuple[None, None]:
    """(core dependencies, distinct packages across the optional extras) of pyproject.toml;
    (None, None) on Python 3.10, which has no tomllib: the line counts still print."""
    try:
        import tomllib
    except ModuleNotFoundError:
        return None, None
    project = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    name = re.compile(r"^[A-Za-z0-9_.-]+")
    core = {name.match(d).group(0).lower() for d in project.get("dependencies", [])}
    extras = {name.match(d).group(0).lower() for ds in project.get("optional-dependencies", {}).values()
              for d in ds} - core
    return len(core), len(extras)


def measure(root: Path = ROOT) -> dict:
    core, extras = dependencies(root)
    return {"python": {k: asdict(v) for k, v in python_parts(root).items()},
            "docs_words": docs_words(root), "dependencies": core, "optional_dependencies": extras}


def one_line(m: dict) -> str:
    parts = ", ".join(f"{name} {p['lines']:,} lines / {p['files']} files" for name, p in m["python"].items())
    return (f"size: {parts}; docs {m['docs_words']:,} words; dependencies {m['dependencies']} "
            f"(+{m['optional_dependencies']} optional)")


def table(m: dict) -> str:
    rows = [f"{'':<12}{'lines':>9}{'files':>7}"]
    rows += [f"{name:<12}{p['lines']:>9,}{p['files']:>7}" for name, p in m["python"].items()]
    rows += [f"{'docs':<12}{m['docs_words']:>9,} words",
             f"{'deps':<12}{m['dependencies']:>9} core, {m['optional_dependencies']} optional (extras)"]
    return "\n".join(rows)


if __name__ == "__main__":
    args = sys.argv[1:]
    if args not in ([], ["--line"], ["--json"]):
        raise SystemExit("usage: python tests/size.py [--line | --json]")
    m = measure()
    print(json.dumps(m, indent=1) if args == ["--json"] else one_line(m) if args else table(m))
