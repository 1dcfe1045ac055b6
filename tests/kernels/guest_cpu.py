"""Runs inside a guest whose CPU lacks x86-64-v3 (test_cpu_level.py), as root.

    python -m tests.kernels.guest_cpu OUT_DIR

OUT_DIR holds the binaries the test built on the host (PROGRAMS). This starts the real
`execwatch trace --json`, runs each program from the guest's tmpfs (its exit status and
stderr are what glibc's loader says), waits for their records, and writes
OUT_DIR/result.json with them, the kernel's counts, the CPU levels execwatch reads and the
glibc-hwcaps levels the guest's own ld.so reports as supported.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from execwatch.binfmt.isa import read_cpu_levels
from tests.kernels.guest import tracing

PROGRAMS = ("needs-v3", "uses-v3-lib", "static-v3")  # run; uses-v3-lib loads libv3.so
LIBRARY = "libv3.so"
LDSO = "/lib64/ld-linux-x86-64.so.2"


def run_programs(source: Path, work: Path) -> dict[str, dict[str, object]]:
    for name in (*PROGRAMS, LIBRARY):
        shutil.copy(source / name, work / name)
    out = {}
    for name in PROGRAMS:
        done = subprocess.run([str(work / name)], capture_output=True, text=True, timeout=120)
        out[name] = {"path": str(work / name), "rc": done.returncode, "stderr": done.stderr}
    return out


def main() -> int:
    argv = ["trace", "--json", "--window", "0.2", "--diagnosis-budget", "60"]
    with tracing(Path(sys.argv[1]), argv) as (result, stdout):
        result["cpu_levels"] = read_cpu_levels()
        result["ldso_help"] = subprocess.run([LDSO, "--help"], capture_output=True).stdout.decode()
        with tempfile.TemporaryDirectory() as work:
            runs = run_programs(Path(sys.argv[1]), Path(work))
            result["runs"] = runs
            paths = {str(r["path"]) for r in runs.values()}
            result["all_records_seen"] = stdout.wait_for(
                lambda ls: paths <= {json.loads(x)["path"] for x in ls if x.startswith("{")}, 120
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
