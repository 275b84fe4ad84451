"""Shared fixtures: the tiny SD3 model (built once per session) and ../shared."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]  # test_conftest.py runs this conftest in a scratch session

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("MARBLE_SHARED_DIR", ROOT.parent / "shared"))
NEEDS_SHARED = "needs ../shared"  # the skip reason's prefix, counted in the summary below


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """The read-only ../shared folder (real prompts, images); skip when absent."""
    if not SHARED.is_dir():
        pytest.skip(f"{NEEDS_SHARED} (real prompts and images): {SHARED} is absent")
    return SHARED


def pytest_terminal_summary(terminalreporter) -> None:
    """Name the tests ../shared would have run, so they do not vanish into a skip count."""
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
