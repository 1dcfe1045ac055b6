"""The --run tests' shared directory and their `execwatch scan` process (the issue's cases
and their real materials are tests/support/smoke/smoke_cases.py's)."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.smoke.scan_process import NOBODY, scan_command

__all__ = ["NOBODY", "execwatch_scan", "runs"]


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory every user can read: the unprivileged runs read their images here."""
    d = Path(tempfile.mkdtemp(prefix="execwatch-smoke-test-"))
    d.chmod(0o755)
    yield d
    subprocess.run(["rm", "-rf", str(d)], check=False)


def execwatch_scan(
    *argv: str, user: list[str] | None = None, env: dict[str, str] | None = None
) -> tuple[int, dict[str, Any], str]:
    """`execwatch scan ... --format json` as a process of its own (as `user`, e.g. NOBODY)."""
    cmd = [*(user or []), *scan_command(list(argv))]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd="/",
                          env={**os.environ, **(env or {})})  # fmt: skip
    doc = json.loads(proc.stdout) if proc.stdout.strip() else {}
    return proc.returncode, doc, proc.stderr


def runs(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in doc.get("findings", []) if f.get("source") == "run"]
