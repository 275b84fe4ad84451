"""`marble <cmd>` equals `python -m <module>` for every command, and each package with a CLI runs
as `python -m marble.<package>`.

Checked from the source (no heavy import per command): each module of `marble.cli.COMMANDS`
defines `main` and runs it under `python -m` (a `__main__` guard, or a package `__main__.py`);
each package with a CLI has a `__main__.py` that runs that CLI's `main`. One real subprocess
proves the wiring end to end.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from marble.cli import COMMANDS
from marble.cli import main as marble_main

ROOT = Path(__file__).resolve().parents[1]
# package -> the module whose `main` its `python -m` runs
PACKAGE_MAINS = {
    "marble": "marble.cli",
    "marble.assets": "marble.assets.download",
    "marble.data": "marble.data.cli",
    "marble.models": "marble.models.cli",
    "marble.rewards": "marble.rewards.cli",
    "marble.report": "marble.report.cli",
}


def source(module: str) -> tuple[Path, ast.Module]:
    base = ROOT.joinpath(*module.split("."))
    path = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
    return path, ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def defines_main(tree: ast.Module) -> bool:
    return any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body)


def has_main_guard(tree: ast.Module) -> bool:
    """`if __name__ == "__main__": ... main(...)` at module level."""
    for node in tree.body:
        if (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
                and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__"
                and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in node.test.comparators)):
            return any(isinstance(n, ast.Call) and getattr(n.func, "id", None) == "main"
                       for n in ast.walk(node))
    return False


def main_source_of(package: str) -> str | None:
    """The module a package's `__main__.py` takes `main` from (None when it has none)."""
    path = ROOT.joinpath(*package.split("."), "__main__.py")
    if not path.is_file():
        return None
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and any(a.name == "main" for a in node.names):
            return node.module
    return None


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_module_has_a_main_that_python_m_runs(command):
    module = COMMANDS[command][0]
    path, tree = source(module)
    assert defines_main(tree), f"{path}: `marble {command}` needs a module-level main(argv)"
    runs = has_main_guard(tree) or (path.name == "__init__.py" and main_source_of(module) == module)
    assert runs, f"`python -m {module}` would not run main() (no __main__ guard / __main__.py)"


def test_every_package_with_a_cli_has_a_main_that_runs_it():
    packages_with_cli = {".".join(p.relative_to(ROOT).parent.parts)
                         for p in (ROOT / "marble").rglob("cli.py")}
    missing = packages_with_cli - set(PACKAGE_MAINS)
    assert not missing, f"packages with a cli.py but no entry in PACKAGE_MAINS: {sorted(missing)}"
    for package, module in PACKAGE_MAINS.items():
        assert main_source_of(package) == module, f"{package}/__main__.py should run {module}.main"
    # and every package's CLI is a `marble` command, so both spellings exist
    commands = {m for m, _ in COMMANDS.values()}
    assert set(PACKAGE_MAINS.values()) - {"marble.cli"} <= commands


def test_python_m_package_equals_the_marble_command(capsys):
    """The real thing once: `python -m marble.data --help` prints what `marble data --help` does."""
    with pytest.raises(SystemExit) as exit_:
        marble_main(["data", "--help"])
    assert exit_.value.code == 0
    expected = capsys.readouterr().out
    proc = subprocess.run([sys.executable, "-m", "marble.data", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == expected and "assemble" in expected
