"""The fault table: every test here is a fault case (`@pytest.mark.fault("case")`).

A test injects one fault or several (the `fault_trials` fixture records each injection
and whether it held); at the end of the session the table prints, one row per case:
tried (injections), held (nothing lost, the rerun finished, the error named the cause),
lost (data lost, silently wrong, or a run no rerun can finish), skipped (with the reason).
A test that records nothing counts as one injection: held when it passes. The table itself
is kept and printed by tests/conftest.py (so a run under pytest-xdist prints it too).
"""

from __future__ import annotations

import pytest


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
    """The case's outcome rides on the report (`report.fault`): under pytest-xdist the
    table is kept by the controller, which sees reports and never this module's state;
    tests/conftest.py adds each report's `fault` to the table and prints it."""
    outcome = yield
    report = outcome.get_result()
    fault = {"case": case_of(item), "skipped": None, "results": [], "trials": []}
    if report.skipped and report.when in ("setup", "call"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        fault["skipped"] = reason.removeprefix("Skipped: ")
    elif report.when != "call":
        if not report.failed:
            return
        fault["results"] = [[False, "a fixture failed: the case could not be tried"]]
    else:
        trials = getattr(item, "fault_trials", None)
        results = [list(r) for r in trials.results] if trials is not None and trials.results else []
        if not results:
            results = [[report.passed, item.name]]
        elif report.failed and all(held for held, _ in results):
            results.append([False, "assertion after the injections"])
        fault["results"] = results
        if trials is not None:
            fault["trials"] = [f"{'held' if held else 'LOST'}: {what}" for held, what in trials.results]
    report.fault = fault
