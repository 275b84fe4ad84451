"""The fault table: every test here is a fault case (`@pytest.mark.fault("case")`).

A test injects one fault or several (the `fault_trials` fixture records each injection
and whether it held); at the end of the session the table prints, one row per case:
tried (injections), held (nothing lost, the rerun finished, the error named the cause),
lost (data lost, silently wrong, or a run no rerun can finish), skipped (with the reason).
A test that records nothing counts as one injection: held when it passes.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import pytest


@dataclass
class Row:
    tried: int = 0
    held: int = 0
    lost: int = 0
    skipped: list[str] = field(default_factory=list)
    trials: list[str] = field(default_factory=list)  # what each recorded injection did


TABLE: dict[str, Row] = defaultdict(Row)


class Trials:
    """Injections of one test: `record(held, what)`; `lost` lists what did not hold."""

    def __init__(self):
        self.results: list[tuple[bool, str]] = []

    def record(self, held: bool, what: str = "") -> None:
        self.results.append((bool(held), what))

    @property
    def lost(self) -> list[str]:
        return [what for held, what in self.results if not held]


def pytest_configure(config):
    config.addinivalue_line("markers", "fault(case): a fault-suite case (tests/faults)")


def case_of(item) -> str:
    marker = item.get_closest_marker("fault")
    return marker.args[0] if marker and marker.args else item.name


@pytest.fixture
def fault_trials(request) -> Trials:
    trials = Trials()
    request.node.fault_trials = trials
    return trials


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    row = TABLE[case_of(item)]
    if report.skipped and report.when in ("setup", "call"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        row.skipped.append(reason.removeprefix("Skipped: "))
        return
    if report.when != "call":
        if report.failed:  # a fixture that failed: the case could not be tried
            row.tried, row.lost = row.tried + 1, row.lost + 1
        return
    trials = getattr(item, "fault_trials", None)
    results = trials.results if trials is not None and trials.results else []
    if not results:
        results = [(report.passed, item.name)]
    elif report.failed and all(held for held, _ in results):
        results = [*results, (False, "assertion after the injections")]
    if trials is not None:
        row.trials += [f"{'held' if held else 'LOST'}: {what}" for held, what in trials.results]
    row.tried += len(results)
    row.held += sum(held for held, _ in results)
    row.lost += sum(not held for held, _ in results)


def pytest_terminal_summary(terminalreporter):
    if not TABLE:
        return
    write = terminalreporter.write_line
    width = max(len(case) for case in TABLE)
    terminalreporter.section("fault table")
    write(f"{'case':<{width}}  tried  held  lost")
    for case, row in sorted(TABLE.items()):
        line = f"{case:<{width}}  {row.tried:>5}  {row.held:>4}  {row.lost:>4}"
        if row.skipped:
            line += f"  (skipped: {'; '.join(sorted(set(row.skipped)))})"
        write(line)
        for trial in row.trials:
            write(f"    {trial}")
    total = Row(sum(r.tried for r in TABLE.values()), sum(r.held for r in TABLE.values()),
                sum(r.lost for r in TABLE.values()))
    write(f"{'total':<{width}}  {total.tried:>5}  {total.held:>4}  {total.lost:>4}")
