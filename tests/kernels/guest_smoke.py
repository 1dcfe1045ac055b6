"""Runs inside the oldest guest kernel (test_smoke_oldest.py), as root.

    python -m tests.kernels.guest_smoke OUT_DIR

OUT_DIR holds what the host built: each case's image or build output
(tests/support/smoke/smoke_cases.py) and plan.json, the scans to run (argv, user, the
case's directory relative to OUT_DIR, env). Each scan is `execwatch scan --run --format
json` in a process of its own: root's forked from this one, which imported the scan
command once (under TCG an interpreter's start and imports take seconds, which every scan
would pay), nobody's started as on the host (scan_process.run_scan: setpriv and a fresh
interpreter; a forked child that dropped to nobody here failed the run's lazy
`import ctypes`: "No module named 'ctypes'"); its exit
code, output and wall time go to OUT_DIR/result.json, rewritten after each, for the host to
judge with the same table.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from execwatch.cli import build_parser, main
from tests.support.smoke import scan_process

TIMEOUT_S = 600


def child(step: dict[str, Any], stdout: int, stderr: int) -> None:
    """In the forked process: the case's directory and env, then the command."""
    code = 70
    try:
        os.dup2(stdout, 1)
        os.dup2(stderr, 2)
        os.chdir(step["cwd"])
        os.environ.update(step["env"])
        code = main(["scan", *scan_process.SCAN_FLAGS, *step["argv"]])
    except SystemExit as exc:  # argparse's exit 2
        code = exc.code if isinstance(exc.code, int) else 2
    except BaseException as exc:  # a crash is the outcome the host judges
        os.write(2, f"guest_smoke: {exc!r}\n".encode())
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def wait(pid: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def run_scan(step: dict[str, Any]) -> dict[str, Any]:
    """The same result as scan_process.run_scan's; root's from a forked process."""
    if step["user"] != "root":
        return scan_process.run_scan(step, TIMEOUT_S)
    started = time.monotonic()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        pid = os.fork()
        if pid == 0:
            child(step, out.fileno(), err.fileno())
        code = wait(pid, TIMEOUT_S)
        out.seek(0)
        err.seek(0)
        return {
            "code": code,
            "stdout": out.read().decode(errors="replace"),
            "stderr": err.read().decode(errors="replace"),
            "seconds": round(time.monotonic() - started, 1),
            "kernel": os.uname().release,
        }


def main_guest() -> int:
    out = Path(sys.argv[1])
    plan = json.loads((out / "plan.json").read_text())
    build_parser("scan")  # the scan command's modules, imported once before the forks
    started = time.monotonic()
    result: dict[str, object] = {"release": os.uname().release, "results": {}}
    results: dict[str, object] = {}
    for key, step in plan.items():
        results[key] = run_scan({**step, "cwd": str(out / step["cwd"])})
        result.update(results=results, seconds=round(time.monotonic() - started, 1))
        (out / "result.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main_guest())
