"""tests/conftest.py itself: tests that need ../shared are named in the summary when it is absent."""

from __future__ import annotations

from pathlib import Path

CONFTEST = Path(__file__).with_name("conftest.py")


def test_shared_skips_are_listed_in_the_summary(pytester, monkeypatch, tmp_path):
    monkeypatch.setenv("MARBLE_SHARED_DIR", str(tmp_path / "no-shared"))
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(test_uses_shared="""
        def test_reads_prompts(shared_dir):
            assert shared_dir.is_dir()

        def test_plain():
            pass
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines([f"*1 tests skipped: {tmp_path / 'no-shared'} is absent*",
                                 "*MARBLE_SHARED_DIR*", "  test_uses_shared.py::test_reads_prompts"])
    monkeypatch.setenv("MARBLE_SHARED_DIR", str(tmp_path))  # present: no skip, no summary
    again = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    again.assert_outcomes(passed=2)
    assert "tests skipped" not in again.stdout.str()


FAULTS_CONFTEST = Path(__file__).with_name("faults") / "conftest.py"
FAULT_CASES = """
import pytest

@pytest.mark.fault("two injections")
def test_two(fault_trials):
    fault_trials.record(True, "first")
    fault_trials.record(False, "second")

@pytest.mark.fault("plain")
def test_plain():
    pass
"""


def test_the_fault_table_prints_with_and_without_xdist_workers(pytester):
    """`make test` runs on pytest-xdist workers: the table is built from the reports the
    controller receives, so it prints the same rows as a one-process run (it printed nothing)."""
    pytester.makeconftest(CONFTEST.read_text())
    faults = pytester.mkpydir("faults")
    (faults / "conftest.py").write_text(FAULTS_CONFTEST.read_text())
    (faults / "test_cases.py").write_text(FAULT_CASES)
    for workers in ([], ["-n", "2"]):
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *workers)
        result.assert_outcomes(passed=2)
        result.stdout.fnmatch_lines(["*fault table*", "plain * 1 * 1 * 0", "two injections * 2 * 1 * 1",
                                     "    held: first", "    LOST: second", "total * 3 * 2 * 1"])


def test_every_module_of_the_localhost_slurm_runs_on_one_worker_slow_groups_first(pytester):
    """Two tests on the one localhost SLURM node at once would compete for its CPUs and
    timers: under xdist, every module with a `slurm` test is one unit of work, started first,
    then the modules by their count of `slow` tests; a module's tests share one worker."""
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makeini("[pytest]\nmarkers =\n    slurm: x\n    slow: y\n")
    pytester.makepyfile(
        test_a="import pytest\n\n@pytest.mark.slurm\ndef test_a1():\n    pass\n\ndef test_a2():\n    pass\n",
        test_b="def test_b1():\n    pass\n\ndef test_b2():\n    pass\n",
        test_c="import pytest\n\n@pytest.mark.slow\ndef test_c1():\n    pass\n",
        test_d="import pytest\n\n@pytest.mark.slurm\ndef test_d1():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-v", "-n", "2")
    result.assert_outcomes(passed=6)
    worker = {}  # test -> worker, from lines like "[gw1] [ 20%] PASSED test_a.py::test_a1"
    for line in result.stdout.lines:
        if "PASSED" in line and "::" in line:
            worker[line.split("::")[1].split()[0]] = line.split("]")[0].lstrip("[")
    assert worker["test_a1"] == worker["test_a2"] == worker["test_d1"], worker
    assert worker["test_b1"] == worker["test_b2"], worker
    # One worker runs the units in the order they are handed out.
    alone = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-v", "-n", "1")
    ran = [line.split("PASSED ")[1].split()[0] for line in alone.stdout.lines if "PASSED" in line]
    assert ran == ["test_a.py::test_a1", "test_a.py::test_a2", "test_d.py::test_d1", "test_c.py::test_c1",
                   "test_b.py::test_b1", "test_b.py::test_b2"], ran


def test_the_conftest_loads_where_pytest_xdist_is_not_installed(pytester):
    """`pytest tests` in a venv without pytest-xdist (a user's, an older clip venv) must run:
    the scheduler hook is optional, not an unknown hook."""
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(test_plain="def test_plain():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:xdist")
    result.assert_outcomes(passed=1)
