"""`python -m tests.faults [pytest args]`: the fault suite alone, then its fault table."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

if __name__ == "__main__":
    sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", str(HERE), *sys.argv[1:]]))
