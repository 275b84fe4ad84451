"""The import graph of `marble/` has no cycle and no module reaches into another's private names.

The graph is built from the AST of every module, so it sees what a run can execute, not only
what the first import executes:

- every `import` / `from ... import` anywhere in a file: module level, inside functions and
  methods, under `if`/`try` (a function-level import that closes a cycle is still a cycle, only
  one that waits until the first call to show up);
- relative imports, resolved against the importing module's package;
- `from pkg import name` is an edge to `pkg.name` when that is a module, else to `pkg`;
- importing `a.b.c` also initialises every package above it that the importer is not already
  inside (`a`, `a.b`): an edge to each of those `__init__`s. So a package `__init__` that
  re-exports its submodules COUNTS: `x -> a.b.c` runs `a/__init__.py`, and if that re-exports
  something which imports `x`, that is a real cycle at import time. A module's own parent
  packages are not edges (they are initialised before it runs, and re-exporting a submodule from
  its own `__init__` is the usual, harmless direction);
- string constants that name a module exactly (`"marble.train"`, `"marble.rewards.toy:Toy"`)
  are edges too: the CLI dispatch table and the reward registry import them by name.

Two levels are checked: modules, and the first-level parts of `marble` (`marble.data`,
`marble.rewards`, ..., each top-level module on its own). The second is what keeps the layers
apart: data may use rewards (masks) but then rewards may not use data. A package's command
line (`<pkg>.cli`, `<pkg>.__main__`) is its own node there, not part of its package: it is an
entry point above every library layer (`marble.models.cli` reads a prompt table to pretrain
with), and since no library module may import it, that exemption cannot hide a cycle.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest
from layering import Layer, load_layers, upward_imports

ROOT = Path(__file__).resolve().parents[1]
ENTRY_POINTS = ("cli", "__main__")
MODULE_STRING = re.compile(r"^[A-Za-z_]\w*(\.\w+)+(:\w+)?$")


def module_files(src: Path, package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under `src/package` (packages by their __init__)."""
    out = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _is_package(name: str, files: dict[str, Path]) -> bool:
    return files[name].name == "__init__.py"


def _resolve_relative(importer: str, files: dict[str, Path], level: int, module: str | None) -> str:
    base = importer.split(".")
    if not _is_package(importer, files):
        base = base[:-1]  # a plain module's package
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join(base + ([module] if module else []))


def _targets(node: ast.AST, importer: str, files: dict[str, Path]) -> list[tuple[str, list[str]]]:
    """(module imported, names taken from it) for one import node; only modules in `files`."""
    if isinstance(node, ast.Import):
        return [(alias.name, []) for alias in node.names]
    base = node.module or ""
    if node.level:
        base = _resolve_relative(importer, files, node.level, node.module)
    out = []
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        out.append((sub, []) if sub in files else (base, [alias.name]))
    return out


def _known(name: str, files: dict[str, Path]) -> str | None:
    """The deepest module of `files` that `name` (possibly `pkg.mod.attr`) denotes."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in files:
            return candidate
        parts.pop()
    return None


def _with_packages(target: str, importer: str, files: dict[str, Path]) -> list[str]:
    """`target` plus each package above it that importing it initialises (see module docstring)."""
    parts = target.split(".")
    inside = {".".join(importer.split(".")[:i]) for i in range(1, importer.count(".") + 2)}
    chain = [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
    return [m for m in chain if m in files and m not in inside and m != importer]


def _docstring_nodes(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def scan(src: Path, package: str):
    """(edges: module -> set of modules, private: list of 'importer: module._name' findings)."""
    edges, private, _ = scan_with_lines(src, package)
    return edges, private


@functools.lru_cache(maxsize=None)
def scan_with_lines(src: Path, package: str):
    """scan's two, and where each edge is first written: (importer, module) -> 'file:line'."""
    files = module_files(src, package)
    edges: dict[str, set[str]] = {name: set() for name in files}
    private: list[str] = []
    lines: dict[tuple[str, str], str] = {}
    for importer, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        docstrings = _docstring_nodes(tree)
        aliases: dict[str, str] = {}  # local name -> module, for `alias._private` attribute use
        for node in ast.walk(tree):
            found: list[tuple[str, list[str]]] = []
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found = _targets(node, importer, files)
                for alias, (target, names) in zip(node.names, found):
                    # `import a.b as m` and `from a import b` (b a module) bind a module name
                    if (alias.asname or isinstance(node, ast.ImportFrom)) and not names:
                        aliases[alias.asname or alias.name] = target
            elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
                  and id(node) not in docstrings and MODULE_STRING.match(node.value)):
                found = [(node.value.split(":")[0], [])]
            for target, names in found:
                module = _known(target, files)
                if module is None:
                    continue  # outside the package (stdlib, torch, ...)
                for reached in _with_packages(module, importer, files):
                    edges[importer].add(reached)
                    where = f"{path.relative_to(src)}:{node.lineno}"  # ast.walk is breadth-first:
                    if lines.get((importer, reached), (None, 1 << 30))[1] > node.lineno:  # keep the top one
                        lines[(importer, reached)] = (where, node.lineno)
                for name in names:
                    if name.startswith("_") and not name.startswith("__") and module != importer:
                        private.append(f"{importer}: from {module} import {name}")
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and node.attr.startswith("_")
                    and not node.attr.startswith("__") and aliases[node.value.id] != importer):
                private.append(f"{importer}: {aliases[node.value.id]}.{node.attr}")
    return edges, private, {key: where for key, (where, _) in lines.items()}


def find_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component with more than one node (or a self-loop), as a path."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan; the graphs here are a few hundred nodes deep at most
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(edges.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1 or node in edges.get(node, ()):
                components.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return components


def cycle_path(edges: dict[str, set[str]], component: list[str]) -> str:
    """One concrete cycle through the component's first node, `a -> b -> a`, for the message."""
    start, members = component[0], set(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:  # breadth-first inside the component back to `start`
        nxt = []
        for node in frontier:
            for succ in sorted(edges[node] & members):
                if succ == start:
                    return " -> ".join(paths[node] + [start])
                if succ not in paths:
                    paths[succ] = paths[node] + [succ]
                    nxt.append(succ)
        frontier = nxt
    return " -> ".join(component)


def layer_edges(edges: dict[str, set[str]], package: str) -> dict[str, set[str]]:
    """Collapse modules to the first level below `package` (marble.data.x -> marble.data)."""
    def layer(name: str) -> str:
        parts = name.split(".")
        if parts[-1] in ENTRY_POINTS:
            return name  # a package's CLI sits above every library layer (see module docstring)
        return ".".join(parts[:2]) if len(parts) > 1 else name

    out: dict[str, set[str]] = {}
    for src, dsts in edges.items():
        if src == package:
            continue
        out.setdefault(layer(src), set()).update(layer(d) for d in dsts if d != package)
    for src in out:
        out[src].discard(src)
    return out


def problems(src: Path, package: str, fence: list[Layer] | None = None) -> list[str]:
    """Cycles, private names, and with `layers` (docs/layers.yaml) every upward import."""
    edges, private, lines = scan_with_lines(src, package)
    found = [f"module cycle: {cycle_path(edges, c)}" for c in find_cycles(edges)]
    layers = layer_edges(edges, package)
    found += [f"package cycle: {cycle_path(layers, c)}" for c in find_cycles(layers)]
    found += [f"private name across modules: {p}" for p in private]
    if fence is not None:
        found += upward_imports(edges, lines, fence, package)
    return found


def test_marble_has_no_import_cycle_no_private_import_and_no_upward_import():
    found = problems(ROOT, "marble", load_layers())
    assert not found, "\n".join(found)


def test_the_scan_sees_every_kind_of_import():
    """The real tree: function-level, relative-free dotted, registry strings all become edges."""
    edges, _ = scan(ROOT, "marble")
    assert "marble.training.run" in edges["marble.train"]  # function-level, in main()
    assert "marble.rewards.toy" in edges["marble.rewards.catalogue"]  # a registry string
    assert "marble.train" in edges["marble.cli"]  # the dispatch table


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


CLEAN = {
    "pkg/__init__.py": "",
    "pkg/core/__init__.py": "from .maths import add\n",
    "pkg/core/maths.py": "def add(a, b):\n    return a + b\n",
    "pkg/loop.py": "from pkg.core import add\n",
    "pkg/cli.py": "def main():\n    from pkg import loop\n",
}


def test_a_clean_synthetic_package_passes(tmp_path):
    _write(tmp_path, CLEAN)
    assert problems(tmp_path, "pkg") == []


@pytest.mark.parametrize("extra, expected", [
    # module level, both ways
    ({"pkg/core/maths.py": "import pkg.loop\n"}, "module cycle"),
    # the back edge hidden in a function: still a cycle
    ({"pkg/core/maths.py": "def f():\n    from pkg.loop import x\n"}, "module cycle"),
    # relative import two levels up, inside a method
    ({"pkg/core/maths.py": "class A:\n    def f(self):\n        from .. import loop\n"}, "module cycle"),
    # through a package __init__ that re-exports: cli -> core (init) -> maths -> cli
    ({"pkg/loop.py": "", "pkg/core/maths.py": "from pkg.cli import main\n",
      "pkg/cli.py": "from pkg.core import add\n"}, "module cycle"),
    # a registry string naming the module
    ({"pkg/core/maths.py": "TARGET = 'pkg.loop:run'\n"}, "module cycle"),
    # a library module importing a CLI module closes the layer cycle the CLI's exemption opened
    ({"pkg/other/__init__.py": "", "pkg/other/cli.py": "from pkg.core.maths import add\n",
      "pkg/core/extra.py": "from pkg.other.cli import main\n"}, "package cycle"),
    # two packages that use each other through different modules: no module cycle, a layer cycle
    ({"pkg/other/__init__.py": "", "pkg/other/a.py": "from pkg.core.maths import add\n",
      "pkg/core/extra.py": "from pkg.other.b import y\n", "pkg/other/b.py": "y = 1\n"},
     "package cycle"),
    # a private name, from-imported or reached through a module alias
    ({"pkg/loop.py": "from pkg.core.maths import _helper\n"}, "private name"),
    ({"pkg/loop.py": "import pkg.core.maths as m\nm._helper()\n"}, "private name"),
    ({"pkg/loop.py": "from pkg.core import maths\nmaths._helper()\n"}, "private name"),
])
def test_an_injected_problem_is_caught(tmp_path, extra, expected):
    _write(tmp_path, {**CLEAN, **extra})
    found = problems(tmp_path, "pkg")
    assert any(p.startswith(expected) for p in found), found


def test_a_cycle_is_reported_as_a_path(tmp_path):
    _write(tmp_path, {**CLEAN, "pkg/core/maths.py": "def f():\n    import pkg.loop\n"})
    assert "module cycle: pkg.core -> pkg.core.maths -> pkg.loop -> pkg.core" in problems(tmp_path, "pkg")


# Third-party packages worth deferring: each costs a second or more to import, or is optional.
HEAVY = {"diffusers", "transformers", "peft", "open_clip", "mmdet", "mmcv", "paddleocr", "paddle",
         "onnxruntime", "matplotlib", "huggingface_hub", "safetensors", "pandas", "scipy",
         "torchvision", "wandb", "tensorboard", "torch", "dvclive", "PIL", "cv2", "sglang",
         "image_reward", "hpsv2", "Levenshtein", "rapidfuzz"}


def _module_level(files: dict[str, Path], module: str) -> tuple[set[str], set[str]]:
    """(third-party top-level packages, marble modules) a module imports at module level."""
    external, internal = set(), set()
    for node in ast.parse(files[module].read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for target, _ in _targets(node, module, files):
                known = _known(target, files)
                if known:
                    internal.update(_with_packages(known, module, files))
                elif not getattr(node, "level", 0):
                    external.add(target.split(".")[0])
    return external, internal


def heavy_dependencies(files: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the HEAVY packages importing it loads (module-level imports, transitively)."""
    direct = {m: _module_level(files, m) for m in files}
    out: dict[str, set[str]] = {}
    for module in files:
        seen, todo, heavy = set(), [module], set()
        while todo:
            current = todo.pop()
            if current not in seen:
                seen.add(current)
                heavy |= direct[current][0] & HEAVY
                todo.extend(direct[current][1])
        out[module] = heavy
    return out


def is_entry_point(module: str) -> bool:
    """Command lines and tools import lazily so that `--help` stays fast; the library may not."""
    last = module.split(".")[-1]
    return (last in ENTRY_POINTS or last.endswith("_cli") or module in ("marble.train", "marble.evaluate")
            or module.startswith("marble.tools."))


def deferred_without_cause(src: Path, package: str) -> list[str]:
    """Function-level imports of package modules that defer no heavy dependency."""
    files = module_files(src, package)
    heavy = heavy_dependencies(files)
    found = []
    for module, path in files.items():
        if is_entry_point(module):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        top = {id(node) for node in tree.body}
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or id(node) in top:
                continue
            for target, _ in _targets(node, module, files):
                known = _known(target, files)
                if known and known != module:
                    # importing a module first runs its packages' __init__ (marble.balancers'
                    # loads torch for marble.balancers.cadence)
                    loaded = _with_packages(known, module, files) or [known]
                    if not set().union(*(heavy[m] for m in loaded)) - heavy[module]:
                        found.append(f"{module}:{node.lineno}: {known} (defers nothing heavy)")
    return sorted(set(found))


def test_function_level_imports_only_defer_heavy_dependencies():
    """A function-level import of a marble module must save its importer a heavy or optional
    package (diffusers, transformers, open_clip, mmdet, ...); otherwise it only hides an edge."""
    found = deferred_without_cause(ROOT, "marble")
    assert not found, "\n".join(found)


def test_a_needless_deferred_import_is_caught(tmp_path):
    _write(tmp_path, {**CLEAN, "pkg/loop.py": "import torch\n\ndef f():\n    from pkg.core import add\n",
                      "pkg/plot.py": "import matplotlib\n",
                      "pkg/core/extra.py": "def g():\n    from pkg import plot\n"})
    found = deferred_without_cause(tmp_path, "pkg")
    assert [f.split(":")[0] for f in found] == ["pkg.loop"], found  # pkg.core.extra defers matplotlib


EXPERIMENTS = "marble.experiments"


def product_imports_of_experiments(edges: dict[str, set[str]]) -> list[str]:
    """`importer -> target` for every module outside marble.experiments that imports one inside."""
    inside = lambda m: m == EXPERIMENTS or m.startswith(EXPERIMENTS + ".")  # noqa: E731
    return sorted(f"{src} -> {dst}" for src, dsts in edges.items() if not inside(src)
                  for dst in dsts if inside(dst))


def test_no_product_module_imports_the_experiments():
    """The laboratory (claim, zoo, pilot) sits above the product: the report reads its
    verdict.json, never its code (docs/layers.yaml's last layer)."""
    edges, _ = scan(ROOT, "marble")
    assert not product_imports_of_experiments(edges)


@pytest.mark.parametrize("importer", ["marble.report.build", "marble.workflow.plan_price",
                                      "marble.tools.mutants", "marble.cli"])
def test_an_import_of_the_experiments_from_the_product_is_caught(tmp_path, importer):
    """The fence, by injection: a product module (the report, the workflow, a tool, even the
    dispatch) that imports marble.experiments fails both the layer check and the direct one."""
    layers = load_layers()
    edges = {importer: {"marble.experiments.claim_stats"}, "marble.experiments.claim_stats": set()}
    lines = {(importer, "marble.experiments.claim_stats"): "x.py:1"}
    found = upward_imports(edges, lines, layers, "marble")
    assert any(f.startswith("upward import: x.py:1") for f in found), found
    assert product_imports_of_experiments(edges) == [f"{importer} -> marble.experiments.claim_stats"]
