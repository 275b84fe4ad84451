"""The layer fence: docs/layers.yaml read, each import edge checked against it, and the
layer table of docs/ARCHITECTURE.md rendered from it.

`python tests/layering.py --write-doc` rewrites that table after an edit of docs/layers.yaml;
tests/test_layering.py fails while the two differ.
"""

from __future__ import annotations

import fnmatch
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
LAYERS_FILE = ROOT / "docs" / "layers.yaml"
ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"
BEGIN = "<!-- layers: generated from docs/layers.yaml by `python tests/layering.py --write-doc` -->"
END = "<!-- /layers -->"
USES = ("below", "nothing")


@dataclass(frozen=True)
class Layer:
    rank: int  # 1 = lowest
    name: str
    modules: tuple[str, ...]
    uses: str  # "below": every lower layer; "nothing": nothing of the package


class LayerFileError(ValueError):
    pass


def load_layers(path: Path = LAYERS_FILE) -> list[Layer]:
    """The layers, lowest first; a malformed entry is one line naming it."""
    entries = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(entries, list) or not entries:
        raise LayerFileError(f"{path}: expected a list of layers")
    layers, seen = [], set()
    for rank, entry in enumerate(entries, start=1):
        where = f"{path}: layer {rank}"
        if not isinstance(entry, dict) or set(entry) != {"name", "modules", "uses"}:
            raise LayerFileError(f"{where}: needs exactly the keys name, modules, uses")
        if entry["uses"] not in USES:
            raise LayerFileError(f"{where}: uses must be one of {USES}, not {entry['uses']!r}")
        for module in entry["modules"]:
            if module in seen:
                raise LayerFileError(f"{where}: {module} is already in an earlier layer")
            seen.add(module)
        layers.append(Layer(rank, str(entry["name"]), tuple(entry["modules"]), entry["uses"]))
    return layers


def _specificity(pattern: str, module: str) -> int:
    """Dotted parts of `pattern` when it covers `module` (itself or below it), else 0."""
    if fnmatch.fnmatchcase(module, pattern) or fnmatch.fnmatchcase(module, pattern + ".*"):
        return pattern.count(".") + 1
    return 0


def layer_of(module: str, layers: list[Layer]) -> Layer | None:
    """The layer whose most specific entry covers `module`; None when none does."""
    best, best_score = None, 0
    for layer in layers:
        for pattern in layer.modules:
            score = _specificity(pattern, module)
            if score > best_score:
                best, best_score = layer, score
    return best


def upward_imports(edges: dict[str, set[str]], lines: dict[tuple[str, str], str],
                   layers: list[Layer], package: str) -> list[str]:
    """One line per import that leaves the layers its importer may use, and per module that no
    layer covers. `lines[(importer, target)]` is where the import is written (`file:line`)."""
    found = []
    for importer in sorted(edges):
        if importer == package:
            continue  # the root package holds only the version; every module is inside it
        own = layer_of(importer, layers)
        if own is None:
            found.append(f"module in no layer: {importer} (add it to {LAYERS_FILE.name})")
            continue
        for target in sorted(edges[importer]):
            other = layer_of(target, layers)
            if target == package or other is None or other is own:
                continue
            if own.uses == "nothing" or other.rank > own.rank:
                where = lines.get((importer, target), importer)
                found.append(f"upward import: {where}: {importer} ({own.rank}. {own.name}) -> "
                             f"{target} ({other.rank}. {other.name})")
    return found


def _as_path(module: str, root: Path) -> str:
    """`marble.maths` -> `marble/maths/`, `marble.config` -> `marble/config.py`, globs kept."""
    rel = module.replace(".", "/")
    return f"`{rel}/`" if (root / rel).is_dir() else f"`{rel}.py`"


def render_table(layers: list[Layer], root: Path = ROOT) -> str:
    rows = ["| # | layer | modules | may use |", "|---|---|---|---|"]
    for layer in layers:
        if layer.uses == "nothing":
            uses = "nothing of marble"
        else:
            uses = f"layers 1-{layer.rank - 1}" if layer.rank > 2 else "layer 1"
        modules = ", ".join(_as_path(m, root) for m in layer.modules)
        rows.append(f"| {layer.rank} | {layer.name} | {modules} | {uses} |")
    return "\n".join(rows)


def doc_section(text: str) -> str | None:
    """The generated table between BEGIN and END in `text`, or None when the markers are gone."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        return None
    return text[start + len(BEGIN):end].strip("\n")


def write_doc(path: Path = ARCHITECTURE) -> None:
    text = path.read_text(encoding="utf-8")
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"{path}: the markers {BEGIN!r} ... {END!r} are missing")
    new = text[:start + len(BEGIN)] + "\n" + render_table(load_layers()) + "\n" + text[end:]
    tmp = path.with_suffix(".md.tmp")  # whole or not at all
    tmp.write_text(new, encoding="utf-8")
    tmp.replace(path)


if __name__ == "__main__":
    if sys.argv[1:] != ["--write-doc"]:
        raise SystemExit("usage: python tests/layering.py --write-doc")
    write_doc()
