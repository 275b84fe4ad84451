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
