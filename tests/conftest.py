"""Shared fixtures: the tiny SD3 model (built once per session) and ../shared; the fault
table (tests/faults) and the grouping that lets `make test` run on pytest-xdist workers."""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]  # test_conftest.py runs this conftest in a scratch session

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("MARBLE_SHARED_DIR", ROOT.parent / "shared"))
NEEDS_SHARED = "needs ../shared"  # the skip reason's prefix, counted in the summary below
# The test beds (tests/beds: mirrors, replicas, fake servers) are the package `beds`, outside the
# shipped `marble`: pytest puts tests/ on sys.path for this process, and the environment carries
# it to the processes the tests start (`python -m beds.fake_sglang` as a judge's server command).
BEDS_PATH = str(ROOT / "tests")
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (BEDS_PATH, os.environ.get("PYTHONPATH")) if p)


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """The read-only ../shared folder (real prompts, images); skip when absent."""
    if not SHARED.is_dir():
        pytest.skip(f"{NEEDS_SHARED} (real prompts and images): {SHARED} is absent")
    return SHARED


def pytest_terminal_summary(terminalreporter) -> None:
    """The fault table (when fault cases ran); then the tests ../shared would have run, named
    so they do not vanish into a skip count."""
    if FAULT_TABLE:
        _print_fault_table(terminalreporter)
        if os.environ.get(FAULT_TABLE_MD):
            Path(os.environ[FAULT_TABLE_MD]).write_text(fault_table_markdown(), encoding="utf-8")
    skipped = [r for r in terminalreporter.stats.get("skipped", [])
               if NEEDS_SHARED in str(getattr(r, "longrepr", ""))]
    if skipped:
        terminalreporter.write_sep("=", f"{len(skipped)} tests skipped: {SHARED} is absent", yellow=True)
        terminalreporter.write_line("set MARBLE_SHARED_DIR to a folder with datasets/ and images/ to run:")
        for report in skipped:
            terminalreporter.write_line(f"  {report.nodeid}")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A tiny SD3 pipeline saved with save_pretrained, so tests use from_pretrained."""
    from marble.models import save_tiny_pipeline

    out = tmp_path_factory.mktemp("models") / "tiny-sd3"
    save_tiny_pipeline(out, seed=0)
    return out


# ------------------------------------------------------------------ pytest-xdist groups
# `make test` runs two pytest-xdist workers. Each test module is one unit of work, so its
# module-scoped fixtures are built once; every module with a test of the localhost SLURM joins
# one unit "slurm", so two such tests never share its one 2-CPU node and its timers. The units
# start in the workers' collection order, which puts slurm first and then the modules with the
# most `slow` tests: the longest start first instead of leaving one worker idle at the end.
# (xdist's own `--dist loadgroup` marks do nothing under pytest 9.2, which no longer reads the
# node id it rewrites: the unit is chosen here, from the node id's module.)

def _uses_localhost_slurm(path: Path) -> bool:
    try:
        return "mark.slurm" in path.read_text(encoding="utf-8")
    except OSError:
        return False


def work_unit(nodeid: str, rootpath: Path, slurm_cache: dict) -> str:
    module = nodeid.split("::", 1)[0]
    if module not in slurm_cache:
        slurm_cache[module] = _uses_localhost_slurm(rootpath / module)
    return "slurm" if slurm_cache[module] else module


@pytest.hookimpl(optionalhook=True)  # a venv without pytest-xdist has no such hook: not an error
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        """xdist's per-module scheduling, with every localhost-SLURM module one unit and the
        units in collection order (no reorder by size)."""

        def __init__(self, config, log=None):
            config.option.loadscopereorder = False
            super().__init__(config, log)
            self._slurm = {}

        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid, config.rootpath, self._slurm)

    return ModuleScheduling(config, log)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items) -> None:
    """In an xdist worker: the units (above) slurm first, then by their count of slow tests."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    cache = {}
    unit = {item.nodeid: work_unit(item.nodeid, config.rootpath, cache) for item in items}
    slow, first = defaultdict(int), {}
    for index, item in enumerate(items):
        slow[unit[item.nodeid]] += bool(item.get_closest_marker("slow"))
        first.setdefault(unit[item.nodeid], index)
    rank = {u: (u != "slurm", -slow[u], first[u]) for u in first}
    items.sort(key=lambda item: rank[unit[item.nodeid]])  # stable: a module keeps its order


# ------------------------------------------------------------------ the fault table

@dataclass
class FaultRow:
    tried: int = 0
    held: int = 0
    lost: int = 0
    skipped: list[str] = field(default_factory=list)
    trials: list[str] = field(default_factory=list)  # what each recorded injection did


FAULT_TABLE: dict[str, FaultRow] = defaultdict(FaultRow)


def pytest_runtest_logreport(report) -> None:
    """tests/faults/conftest.py puts each fault case's outcome on its report; reports reach
    this hook in the process that prints the summary, with or without xdist workers."""
    fault = getattr(report, "fault", None)
    if not fault:
        return
    row = FAULT_TABLE[fault["case"]]
    if fault["skipped"] is not None:
        row.skipped.append(fault["skipped"])
        return
    row.trials += fault["trials"]
    row.tried += len(fault["results"])
    row.held += sum(bool(held) for held, _ in fault["results"])
    row.lost += sum(not held for held, _ in fault["results"])


# `MARBLE_FAULT_TABLE_MD=rows.md python -m tests.faults ...`: the same table as markdown rows
# (case | tried | held | lost | outcome), what docs/development.md's fault table is pasted from.
FAULT_TABLE_MD = "MARBLE_FAULT_TABLE_MD"


def fault_table_markdown() -> str:
    lines = []
    for case, row in sorted(FAULT_TABLE.items()):
        outcome = "skipped: " + "; ".join(sorted(set(row.skipped))) if row.skipped else (
            "held" if not row.lost else f"LOST {row.lost}")
        lines.append(f"| {case} | {row.tried} | {row.held} | {row.lost} | {outcome} |")
    return "\n".join(lines) + "\n"


def _print_fault_table(terminalreporter) -> None:
    write = terminalreporter.write_line
    width = max(len(case) for case in FAULT_TABLE)
    terminalreporter.section("fault table")
    write(f"{'case':<{width}}  tried  held  lost")
    for case, row in sorted(FAULT_TABLE.items()):
        line = f"{case:<{width}}  {row.tried:>5}  {row.held:>4}  {row.lost:>4}"
        if row.skipped:
            line += f"  (skipped: {'; '.join(sorted(set(row.skipped)))})"
        write(line)
        for trial in row.trials:
            write(f"    {trial}")
    rows = FAULT_TABLE.values()
    write(f"{'total':<{width}}  {sum(r.tried for r in rows):>5}  {sum(r.held for r in rows):>4}  "
          f"{sum(r.lost for r in rows):>4}")
