"""Issue 37's proof on the oldest guest kernel: every case of the one table
(tests/support/smoke/smoke_cases.py) that tests/smoke/test_cases.py runs on this machine's
kernel, run by `execwatch scan --run` in a bullseye guest (Linux 5.10) and judged by the
same expectations.

5.10 has no binfmt_misc of a user namespace's own: the arm64 runs invoke QEMU directly.
The host builds every case into the guest's output directory; one guest boots (vm.py:
this host's root over 9p, TCG) and runs guest_smoke.py, which starts each scan as a
process of its own, as root and as nobody where the host tests do both.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.kernels.vm import Boot, Kernel, Vm
from tests.support.smoke.smoke_cases import Case, Materials, Outcome, judge, plan, scan_keys

RELEASE = "bullseye"  # the oldest kernel of the matrix (vm.RELEASES)
BOOT_BUDGET_S = 1500
GUEST_COMMAND = ".venv/bin/python -m tests.kernels.guest_smoke /tmp/out"


@pytest.fixture(scope="module")
def guest() -> Iterator[tuple[Boot, dict[str, Any]]]:
    kernel = Kernel.fetched(RELEASE)
    with tempfile.TemporaryDirectory(prefix="execwatch-smoke-oldest-") as tmp:
        out = Path(tmp) / "vm" / "out"
        out.mkdir(parents=True)
        out.chmod(0o755)  # nobody's scans read their cases there
        scans = plan(Materials.build(Path(tmp) / "materials"), out / "cases")
        relative = {k: {**s, "cwd": os.path.relpath(s["cwd"], out)} for k, s in scans.items()}
        (out / "plan.json").write_text(json.dumps(relative))
        vm = Vm(kernel, GUEST_COMMAND, Path(tmp) / "vm", memory_mb=2048, switch_root=True)
        boot = vm.boot(BOOT_BUDGET_S)
        yield boot, boot.result()


def test_the_guest_runs_the_oldest_kernel(guest: tuple[Boot, dict[str, Any]]) -> None:
    boot, result = guest
    assert result["release"] == boot.kernel.version
    assert boot.kernel.version.startswith("5.10."), boot.kernel.version


@pytest.mark.parametrize(("key", "case"), [pytest.param(k, c, id=k) for k, c in scan_keys()])
def test_the_case_says_what_the_table_says(
    guest: tuple[Boot, dict[str, Any]], key: str, case: Case
) -> None:
    boot, result = guest
    assert key in result["results"], boot.explain()
    judge(case, Outcome.of(result["results"][key]))
