"""Fixtures shared by the whole suite."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from execwatch.logs import KeyValueFormatter
from tests.attribution.containerd_env import Containerd

REPO = Path(__file__).resolve().parent.parent
FOREIGN = REPO / ".cache" / "foreign"


@pytest.fixture(scope="session")
def foreign_root() -> Path:
    """Unpacked Debian packages of other architectures (dev/fetch-foreign.sh)."""
    if not (FOREIGN / ".complete-v1").exists():
        pytest.fail(f"{FOREIGN} is missing: run dev/fetch-foreign.sh (make test does)")
    return FOREIGN


@pytest.fixture(scope="module")
def containerd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Containerd]:
    """containerd with its CRI plugin on a private socket, images imported, no registry."""
    runtime = Containerd(tmp_path_factory.mktemp("containerd"))
    try:
        runtime.start()
        yield runtime
    finally:
        runtime.stop()


@pytest.fixture(autouse=True)
def no_cli_log_handler() -> Iterator[None]:
    """A test that runs the CLI in-process points the root logger at the stderr pytest
    captured for it. Later tests would log into that closed stream, and each record
    would print a traceback and slow its thread down."""
    yield
    root = logging.getLogger()
    root.handlers[:] = [h for h in root.handlers if not isinstance(h.formatter, KeyValueFormatter)]
