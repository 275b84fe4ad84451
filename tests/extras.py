"""An optional extra's test: skipped where the extra is not installed, FAILED where it should be.

`make test` sets MARBLE_TEST_EXTRAS to the extras it installed (the Makefile's EXTRAS: CI's
dev,workflow,ocr,zoo); a test whose extra is listed there and does not import is a broken
install, not a reason to skip (a missing torchjd once turned the zoo's tests into skips).
"""

from __future__ import annotations

import importlib
import os

import pytest

ENV = "MARBLE_TEST_EXTRAS"


def installed_extras() -> set[str]:
    return {e.strip() for e in os.environ.get(ENV, "").split(",") if e.strip()}


def needs(module: str, extra: str, module_level: bool = False):
    """The module; a skip naming the extra where it is optional here, a failure where
    MARBLE_TEST_EXTRAS says it was installed. `module_level`: called at a test module's top
    (the whole module is skipped; a failure is a collection error, which fails the run too)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if extra in installed_extras():
            pytest.fail(f"{module} does not import ({exc}) although the `{extra}` extra is installed "
                        f"({ENV}={os.environ[ENV]})", pytrace=False)
        pytest.skip(f"needs the `{extra}` extra ({module}: {exc})", allow_module_level=module_level)
