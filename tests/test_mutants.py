"""The mutation runner (marble/tools/mutants.py) on a toy tree, and the real catalogue's snippets.

The toy: a module with add and mul, a test that checks add only. Mutating add is caught,
mutating mul is missed, a test id that does not exist or a test that only skips is an error
(neither a catch nor a miss), and the toy tree itself is never written.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from marble.tools import mutants as M
from marble.tools.mutants_catalogue import MUTANTS, Mutant

ROOT = Path(__file__).resolve().parents[1]
CALC = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n"


@pytest.fixture
def toy(tmp_path) -> Path:
    root = tmp_path / "toy_tree"
    (root / "toy").mkdir(parents=True)
    (root / "toy" / "__init__.py").write_text("")
    (root / "toy" / "calc.py").write_text(CALC)
    (root / "tests").mkdir()
    (root / "tests" / "test_calc.py").write_text(
        "from toy.calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n")
    return root


def toy_mutant(name, original, replacement, tests=("tests/test_calc.py",)):
    return Mutant(name, "toy/calc.py", original, replacement, tuple(tests))


def test_caught_missed_and_error_on_a_toy_tree(toy):
    mutants = [toy_mutant("add_sub", "return a + b", "return a - b"),
               toy_mutant("mul_pow", "return a * b", "return a ** b"),
               toy_mutant("no_such_test", "return a + b", "return a - b",
                          ("tests/test_calc.py::test_add[no-such-id]",))]
    lines = []
    outcomes = M.run_all(mutants, toy, baseline=False, paths=("toy", "tests"), report=lines.append)
    assert [o.status for o in outcomes] == [M.CAUGHT, M.MISSED, M.ERROR]
    assert (toy / "toy" / "calc.py").read_text() == CALC  # the real tree is untouched
    assert not list(toy.rglob("__pycache__"))  # nothing ran there
    text = M.table(outcomes)
    assert "1 caught, 1 missed, 1 errors of 3 mutants" in text
    assert M.exit_status(outcomes) == 1 and M.exit_status(outcomes[:1]) == 0


def test_only_a_failing_or_passing_run_is_a_verdict():
    assert M.verdict(1, "1 failed in 0.1s") == M.CAUGHT
    assert M.verdict(0, "3 passed in 0.1s") == M.MISSED
    assert M.verdict(0, "2 skipped in 0.1s") == M.ERROR  # a missing extra is not a miss
    assert M.verdict(None) == M.ERROR and M.verdict(2) == M.ERROR and M.verdict(5) == M.ERROR


def test_a_baseline_that_fails_unmutated_is_refused(toy):
    (toy / "tests" / "test_calc.py").write_text("def test_broken():\n    assert False\n")
    with pytest.raises(M.MutantError, match="fail without any mutation"):
        M.run_all([toy_mutant("add_sub", "return a + b", "return a - b")], toy,
                  paths=("toy", "tests"), report=lambda line: None)


def test_a_snippet_not_found_exactly_once_is_an_error_naming_it(toy):
    with pytest.raises(M.MutantError, match=r"'gone'.*found 0 times in toy/calc.py"):
        M.check_catalogue([toy_mutant("gone", "return a / b", "return b")], toy)
    with pytest.raises(M.MutantError, match=r"'twice'.*found 2 times"):
        M.check_catalogue([toy_mutant("twice", "(a, b):", "(b, a):")], toy)
    with pytest.raises(M.MutantError, match="defines no test test_gone"):
        M.check_catalogue([toy_mutant("t", "return a + b", "return a",
                                      ("tests/test_calc.py::test_gone",))], toy)


def test_every_catalogued_mutant_applies_once_to_this_tree():
    """Cheap guard against rot: every snippet occurs exactly once, every named test exists."""
    M.check_catalogue(MUTANTS, ROOT)
    assert len(MUTANTS) >= 17
