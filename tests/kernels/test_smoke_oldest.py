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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.kernels.vm import Boot, Kernel, booted
from tests.support.smoke.smoke_cases import Case, Materials, Outcome, judge, plan, scan_keys

RELEASE = "bullseye"  # the oldest kernel of the matrix (vm.RELEASES)
BOOT_BUDGET_S = 1500
GUEST_COMMAND = ".venv/bin/python -m tests.kernels.guest_smoke /tmp/out"


def write_plan(out: Path) -> None:
    """Every case built into the guest's output directory, and plan.json: their scans,
    each case's directory relative to it (the guest mounts it at /tmp/out)."""
    scans = plan(Materials.build(out.parent / "materials"), out / "cases")
    relative = {k: {**s, "cwd": os.path.relpath(s["cwd"], out)} for k, s in scans.items()}
    (out / "plan.json").write_text(json.dumps(relative))


@pytest.fixture(scope="module")
def guest() -> Iterator[tuple[Boot, dict[str, Any]]]:
    kernel = Kernel.fetched(RELEASE)
    # switch_root: the scans' user namespaces are refused to a chrooted process
    with booted(
        kernel, GUEST_COMMAND, write_plan, BOOT_BUDGET_S, memory_mb=2048, switch_root=True
    ) as boot:
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
