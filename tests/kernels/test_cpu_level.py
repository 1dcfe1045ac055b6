"""UnsupportedCPU for real: a CPU without x86-64-v3 refuses a binary that needs it.

This host's CPU has x86-64-v4, so the failure cannot happen here. A bookworm guest under
QEMU (TCG) with `-cpu Nehalem` (SSE4.2 and POPCNT, no AVX: x86-64-v2) runs the host's
root over 9p (vm.py): the same glibc 2.36 loader, the same `execwatch trace`. The
programs are built here with gcc and musl-gcc (tests/support/binfmt/cbuild.py) and
`-Wl,-z,x86-64-v3`; on this host they run, in the guest ld.so refuses the glibc ones and
the static musl one dies of SIGILL at its AVX2 instruction; execwatch must say why.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from execwatch.binfmt.isa import V3, level_name, read_cpu_levels
from tests.kernels.guest_cpu import LIBRARY, PROGRAMS
from tests.support.binfmt.cbuild import build_level_programs
from tests.support.kernels.vm import Boot, Kernel, Vm

RELEASE = "bookworm"  # the host's own glibc runs in every guest; one kernel is enough
CPU_MODEL = "Nehalem"
BOOT_BUDGET_S = 600
GUEST_COMMAND = ".venv/bin/python -m tests.kernels.guest_cpu /tmp/out"
REFUSAL = "CPU ISA level is lower than required"


@pytest.fixture(scope="module")
def guest() -> Iterator[tuple[Boot, dict[str, Any]]]:
    kernel = Kernel.fetched(RELEASE)
    with tempfile.TemporaryDirectory(prefix="execwatch-cpu-") as tmp:
        out = Path(tmp) / "vm" / "out"
        out.mkdir(parents=True)
        build_level_programs(out)
        vm = Vm(kernel, GUEST_COMMAND, Path(tmp) / "vm", cpu=CPU_MODEL)
        try:
            boot = vm.wait(BOOT_BUDGET_S)
        finally:
            vm.kill()
        result_file = out / "result.json"
        assert boot.rc == 0 and result_file.exists(), boot.explain()
        result = json.loads(result_file.read_text())
        assert result["trace_rc"] == 0, boot.explain()
        yield boot, result


def hwcaps_supported(ldso_help: str) -> set[str]:
    """glibc-hwcaps levels `ld.so --help` marks as supported: glibc's own CPU detection."""
    return set(re.findall(r"^\s+(x86-64-v\d) \(supported", ldso_help, re.MULTILINE))


def levels_named(bits: int) -> set[str]:
    return {level_name(b) for b in (2, 4, 8) if bits & b}


def record_of(result: dict[str, Any], program: str) -> dict[str, Any]:
    path = result["runs"][program]["path"]
    records: list[dict[str, Any]] = [r for r in result["records"] if r["path"] == path]
    assert len(records) == 1, result["records"]
    return records[0]


def test_the_same_programs_run_on_this_host(tmp_path: Path) -> None:
    programs = build_level_programs(tmp_path)
    assert (read_cpu_levels() or 0) & V3, "this host lacks x86-64-v3"
    for name in PROGRAMS:
        done = subprocess.run([str(programs[name])], capture_output=True, text=True)
        assert done.returncode == 0 and done.stderr == "" and done.stdout, done


def test_the_guest_cpu_is_x86_64_v2_for_execwatch_and_for_glibc(
    guest: tuple[Boot, dict[str, Any]],
) -> None:
    _, result = guest
    assert result["cpu_levels"] == 0b0011, result["cpu_levels"]  # baseline + v2
    assert hwcaps_supported(result["ldso_help"]) == levels_named(result["cpu_levels"])
    assert hwcaps_supported(subprocess.run(
        ["/lib64/ld-linux-x86-64.so.2", "--help"], capture_output=True, text=True
    ).stdout) == levels_named(read_cpu_levels() or 0)  # fmt: skip


def test_glibc_refuses_them_with_exit_127(guest: tuple[Boot, dict[str, Any]]) -> None:
    _, result = guest
    needs, uses = result["runs"]["needs-v3"], result["runs"]["uses-v3-lib"]
    assert needs["rc"] == 127 and REFUSAL in needs["stderr"], needs
    assert uses["rc"] == 127 and REFUSAL in uses["stderr"], uses
    assert LIBRARY in uses["stderr"]  # ld.so names the library, not the program


def test_trace_reports_unsupported_cpu_with_both_levels(
    guest: tuple[Boot, dict[str, Any]],
) -> None:
    boot, result = guest
    assert result["all_records_seen"], boot.explain()
    r = record_of(result, "needs-v3")
    assert (r["errno"], r["reason"], r["exit_code"]) == ("EXIT127", "UnsupportedCPU", 127), r
    assert r["version"] == "x86-64-v3" and r["library"] is None
    assert "requires x86-64-v3, this CPU has x86-64-v2" in r["detail"], r


def test_a_library_that_needs_the_level_is_named(guest: tuple[Boot, dict[str, Any]]) -> None:
    _, result = guest
    r = record_of(result, "uses-v3-lib")
    assert (r["errno"], r["reason"], r["version"]) == ("EXIT127", "UnsupportedCPU", "x86-64-v3")
    assert r["library"] is not None and r["library"].endswith("/" + LIBRARY), r
    assert "this CPU has x86-64-v2" in r["detail"]


def test_without_a_loader_check_sigill_is_explained(guest: tuple[Boot, dict[str, Any]]) -> None:
    """musl's static binary: nothing refuses it, the CPU does, at the AVX2 instruction."""
    _, result = guest
    assert result["runs"]["static-v3"]["rc"] == -signal.SIGILL
    r = record_of(result, "static-v3")
    assert (r["errno"], r["reason"], r["signal"]) == ("SIGILL", "UnsupportedCPU", 4), r
    assert r["version"] == "x86-64-v3" and "this CPU has x86-64-v2" in r["detail"], r


def test_kernel_counts_are_exact(guest: tuple[Boot, dict[str, Any]]) -> None:
    _, result = guest
    counts = result["kernel_counts"]
    assert counts['execwatch_kernel_early_deaths_total{status="EXIT127"}'] == 2
    assert counts['execwatch_kernel_early_deaths_total{status="SIGILL"}'] == 1
    assert counts['execwatch_kernel_dropped_total{type="ringbuf_full"}'] == 0
