"""Shared fixtures: the tiny SD3 model (built once per session) and ../shared."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("MARBLE_SHARED_DIR", ROOT.parent / "shared"))


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """The read-only ../shared folder (real prompts, images); skip when absent."""
    if not SHARED.is_dir():
        pytest.skip(f"{SHARED} is absent")
    return SHARED


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A tiny SD3 pipeline saved with save_pretrained, so tests use from_pretrained."""
    from marble.models import save_tiny_pipeline

    out = tmp_path_factory.mktemp("models") / "tiny-sd3"
    save_tiny_pipeline(out, seed=0)
    return out
