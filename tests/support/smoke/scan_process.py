"""One `execwatch scan --format json` as a process of its own, as a given user: the host
tests and the guest script (tests/kernels/guest_smoke.py) start the cases' scans with this.
Standard library only: under TCG every import costs seconds."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

NOBODY = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
USERS: dict[str, list[str]] = {"root": [], "nobody": NOBODY}


SCAN_FLAGS = ("--no-progress", "--format", "json")


def scan_command(argv: list[str], user: str = "root") -> list[str]:
    return [*USERS[user], sys.executable, "-m", "execwatch.cli", "scan", *SCAN_FLAGS, *argv]


def run_scan(step: dict[str, Any], timeout: float = 600) -> dict[str, Any]:
    """`step`: argv, user, cwd (where the case was built) and env; returns its exit code,
    stdout, stderr, wall time and the kernel it ran on."""
    started = time.monotonic()
    proc = subprocess.run(scan_command(step["argv"], step["user"]), capture_output=True,
                          text=True, timeout=timeout, cwd=step["cwd"],
                          env={**os.environ, **step["env"]})  # fmt: skip
    return {
        "code": proc.returncode,
        "stdout": proc.stdout,
        "stderr": proc.stderr,
        "seconds": round(time.monotonic() - started, 1),
        "kernel": os.uname().release,
    }
