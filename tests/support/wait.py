"""Polling with a deadline: the one wait of the suite."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest


def wait_until(
    predicate: Callable[[], Any],
    timeout: float = 15.0,
    step: float = 0.05,
    explain: Callable[[], str] | None = None,
) -> Any:
    """Poll until `predicate()` is truthy and return its value; fail the test with a clear
    message if it is not within `timeout` seconds (`explain()`: what was seen instead)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            seen = f"; {explain()}" if explain is not None else ""
            pytest.fail(f"condition not met within {timeout}s: {predicate}{seen}")
        time.sleep(step)
