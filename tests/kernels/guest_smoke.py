"""Runs inside the oldest guest kernel (test_smoke_oldest.py), as root.

    python -m tests.kernels.guest_smoke OUT_DIR

OUT_DIR holds what the host built: each case's image or build output
(tests/support/smoke/smoke_cases.py) and plan.json, the scans to run (argv, user, the
case's directory relative to OUT_DIR, env). Each scan is a real `execwatch scan --run
--format json` process of its own, as root or as nobody (scan_process.run_scan); their
results and the wall time go to OUT_DIR/result.json, rewritten after each, for the host
to judge with the same table. Few imports: every import costs seconds under TCG.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from tests.support.smoke.scan_process import run_scan


def main() -> int:
    out = Path(sys.argv[1])
    plan = json.loads((out / "plan.json").read_text())
    started = time.monotonic()
    result: dict[str, object] = {"release": os.uname().release, "results": {}}
    results: dict[str, object] = {}
    for key, step in plan.items():
        results[key] = run_scan({**step, "cwd": str(out / step["cwd"])})
        result.update(results=results, seconds=round(time.monotonic() - started, 1))
        (out / "result.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
