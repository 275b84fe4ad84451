"""`make mutants`: apply each catalogued mutation of the core in a scratch copy, run the tests
that must catch it, print a caught / missed table (exit 1 unless every mutant is caught).

A mutant is (name, file, exact original snippet, replacement, tests). The snippet must occur
exactly once in its file: a snippet that moved or changed is an error naming the mutant and
the file, so the catalogue (marble/tools/mutants_catalogue.py) cannot rot silently.

The real tree is never written. The scratch copy holds the source folders (marble/, tests/,
workflow/, config/ and the top-level files); each mutant's file is mutated there, its tests run
with PYTHONPATH pointing at the copy (bytecode off, so no stale .pyc can hide a mutation), and
the file is restored before the next mutant. Verdicts from pytest's exit status: 1 (a test
failed) = caught, 0 = missed, anything else (collection error, no such test, all skipped,
timeout) = error.

    python -m marble.tools.mutants              # all, after a baseline run of the named tests
    python -m marble.tools.mutants --list
    python -m marble.tools.mutants --only qp_tie_tolerance --no-baseline
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from marble.tools.mutants_catalogue import MUTANTS, Mutant

ROOT = Path(__file__).resolve().parents[2]
# What a test run needs from the checkout; build outputs, venvs, data and results stay out.
COPY = ("marble", "tests", "workflow", "config", "config.yaml", "slurm", "Snakefile", "pyproject.toml",
        "dvc.yaml", "dvc.lock", "params.yaml", "environment.yml", "Makefile", "README.md", "docs",
        ".test", ".gitignore")  # not .dvc: its cache can be large
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", "*.egg-info")
TIMEOUT_S = 1200  # per mutant; a hang is an error to look at, not a catch
CAUGHT, MISSED, ERROR = "caught", "missed", "ERROR"
CATALOGUE = "marble/tools/mutants_catalogue.py"


class MutantError(ValueError):
    """A catalogue entry that cannot be applied (snippet absent or ambiguous, file missing)."""


def apply(mutant: Mutant, text: str) -> str:
    """`text` with the mutant's snippet replaced; MutantError unless it occurs exactly once."""
    count = text.count(mutant.original)
    if count != 1:
        raise MutantError(f"mutant {mutant.name!r}: snippet {mutant.original!r} found {count} times "
                          f"in {mutant.file} (expected exactly once; update {CATALOGUE})")
    if mutant.replacement == mutant.original:
        raise MutantError(f"mutant {mutant.name!r}: the replacement equals the original")
    return text.replace(mutant.original, mutant.replacement)


@dataclass
class Outcome:
    mutant: Mutant
    status: str
    seconds: float
    tail: str = field(default="", repr=False)


def check_catalogue(mutants: list[Mutant], root: Path) -> None:
    """Every mutant applies to `root` and names existing test files; else one MutantError listing all."""
    problems, names = [], set()
    for m in mutants:
        if m.name in names:
            problems.append(f"mutant {m.name!r}: duplicate name")
        names.add(m.name)
        path = root / m.file
        if not path.is_file():
            problems.append(f"mutant {m.name!r}: {m.file} does not exist")
            continue
        try:
            apply(m, path.read_text(encoding="utf-8"))
        except MutantError as exc:
            problems.append(str(exc))
        if not m.tests:
            problems.append(f"mutant {m.name!r}: names no tests")
        for test in m.tests:
            problems += _missing_test(m.name, root, test)
    if problems:
        raise MutantError("\n".join(problems))


def _missing_test(name: str, root: Path, test: str) -> list[str]:
    """A named test file that does not exist, or a test function it does not define."""
    file, _, node = test.partition("::")
    if not (root / file).is_file():
        return [f"mutant {name!r}: test file {file} does not exist"]
    func = node.split("::")[-1].split("[")[0]
    if func and f"def {func}(" not in (root / file).read_text(encoding="utf-8"):
        return [f"mutant {name!r}: {file} defines no test {func}"]
    return []


def scratch_copy(root: Path, dest: Path, paths=COPY) -> Path:
    """Copy the named top-level paths of `root` that exist into `dest` (no caches)."""
    dest.mkdir(parents=True, exist_ok=True)
    for rel in paths:
        src = root / rel
        if src.is_dir():
            shutil.copytree(src, dest / rel, ignore=IGNORE, symlinks=True)
        elif src.is_file():
            shutil.copy2(src, dest / rel)
    return dest


def _env(tree: Path, shared: Path | None) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")]),
           "PYTHONDONTWRITEBYTECODE": "1"}
    if shared is not None:  # the copy has no ../shared beside it; tests find the real one
        env.setdefault("MARBLE_SHARED_DIR", str(shared))
    return env


def run_tests(tree: Path, tests: tuple[str, ...], shared: Path | None, timeout: float) -> tuple[int | None, str]:
    """pytest's exit status (None on timeout) and the tail of its output."""
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
    try:
        proc = subprocess.run(cmd, cwd=tree, env=_env(tree, shared), capture_output=True, text=True,
                              timeout=timeout, check=False)  # the status is the verdict
    except subprocess.TimeoutExpired as exc:
        return None, str(exc.stdout or "")[-2000:]
    return proc.returncode, (proc.stdout + proc.stderr)[-2000:]


def verdict(returncode: int | None, tail: str = "") -> str:
    # 1 = tests ran and one failed. 2-5 (interrupted, internal, usage, nothing collected) and a
    # timeout say nothing about the mutant: a renamed test must not count as a catch. Exit 0
    # with nothing passed (every named test skipped: a missing extra) is not a miss either.
    if returncode == 0 and not re.search(r"\b\d+ passed", tail):
        return ERROR
    return {0: MISSED, 1: CAUGHT}.get(returncode, ERROR)


def run_mutant(tree: Path, mutant: Mutant, shared: Path | None, timeout: float = TIMEOUT_S) -> Outcome:
    path = tree / mutant.file
    original = path.read_text(encoding="utf-8")
    path.write_text(apply(mutant, original), encoding="utf-8")
    t0 = time.perf_counter()
    try:
        rc, tail = run_tests(tree, mutant.tests, shared, timeout)
    finally:
        path.write_text(original, encoding="utf-8")
    return Outcome(mutant, verdict(rc, tail), time.perf_counter() - t0, tail)


def run_all(mutants: list[Mutant], root: Path = ROOT, shared: Path | None = None, baseline: bool = True,
            timeout: float = TIMEOUT_S, paths=COPY, report=print) -> list[Outcome]:
    """Check the catalogue, copy `root`, (baseline: the named tests pass unmutated), run each mutant."""
    check_catalogue(mutants, root)
    with tempfile.TemporaryDirectory(prefix="marble-mutants-") as tmp:
        tree = scratch_copy(root, Path(tmp) / "tree", paths)
        if baseline:
            tests = tuple(dict.fromkeys(t for m in mutants for t in m.tests))
            t0 = time.perf_counter()
            rc, tail = run_tests(tree, tests, shared, timeout * max(1, len(mutants)))
            report(f"baseline: {len(tests)} test ids, exit {rc}, {time.perf_counter() - t0:.1f} s")
            if verdict(rc, tail) != MISSED:  # i.e. ran and passed
                raise MutantError(f"the named tests fail without any mutation (exit {rc}); "
                                  f"every mutant would read as caught:\n{tail}")
        outcomes = []
        for m in mutants:
            outcomes.append(run_mutant(tree, m, shared, timeout))
            o = outcomes[-1]
            report(f"{o.status:>6}  {o.seconds:7.1f} s  {m.name}")
            if o.status == ERROR:
                report(o.tail)
    return outcomes


def table(outcomes: list[Outcome]) -> str:
    width = max([len(o.mutant.name) for o in outcomes] + [6])
    lines = [f"{'mutant':<{width}}  {'result':<6}  {'time_s':>7}  file", "-" * (width + 40)]
    lines += [f"{o.mutant.name:<{width}}  {o.status:<6}  {o.seconds:7.1f}  {o.mutant.file}" for o in outcomes]
    counts = {s: sum(o.status == s for o in outcomes) for s in (CAUGHT, MISSED, ERROR)}
    total = sum(o.seconds for o in outcomes)
    lines.append(f"{counts[CAUGHT]} caught, {counts[MISSED]} missed, {counts[ERROR]} errors "
                 f"of {len(outcomes)} mutants in {total:.0f} s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m marble.tools.mutants", description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="+", metavar="NAME", help="run only these mutants")
    ap.add_argument("--list", action="store_true", help="print the catalogue and exit")
    ap.add_argument("--no-baseline", action="store_true", help="skip the unmutated run of the named tests")
    ap.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds per mutant")
    args = ap.parse_args(argv)
    mutants = list(MUTANTS)
    if args.only:
        unknown = set(args.only) - {m.name for m in mutants}
        if unknown:
            ap.error(f"unknown mutant(s): {', '.join(sorted(unknown))}")
        mutants = [m for m in mutants if m.name in args.only]
    if args.list:
        for m in mutants:
            print(f"{m.name}: {m.file}: {m.why}\n    tests: {' '.join(m.tests)}")
        return 0
    shared = Path(os.environ.get("MARBLE_SHARED_DIR", ROOT.parent / "shared"))
    try:
        outcomes = run_all(mutants, ROOT, shared if shared.is_dir() else None,
                           baseline=not args.no_baseline, timeout=args.timeout)
    except MutantError as exc:
        print(f"mutants: {exc}", file=sys.stderr)
        return 2
    print(table(outcomes))
    return exit_status(outcomes)


def exit_status(outcomes: list[Outcome]) -> int:
    """0 when every mutant was caught, else 1."""
    return 0 if outcomes and all(o.status == CAUGHT for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
