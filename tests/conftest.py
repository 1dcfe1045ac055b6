"""Fixtures shared by the whole suite."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FOREIGN = REPO / ".cache" / "foreign"


@pytest.fixture(scope="session")
def foreign_root() -> Path:
    """Unpacked Debian packages of other architectures (dev/fetch-foreign.sh)."""
    if not (FOREIGN / ".complete-v1").exists():
        pytest.fail(f"{FOREIGN} is missing: run dev/fetch-foreign.sh (make test does)")
    return FOREIGN
