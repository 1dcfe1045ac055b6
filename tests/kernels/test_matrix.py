"""The kernel matrix: the same real failures, caught by the real `execwatch trace`, on
every kernel from the oldest supported (5.10) to the newest Debian ships, and an arm64
binary that does not fail because the guest's binfmt_misc runs it under user-mode QEMU.

Each kernel boots under QEMU with this host's root over 9p (vm.py) and runs guest.py;
all boot at once, and each test judges one kernel's result.json.
"""

from __future__ import annotations

import itertools
import json
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from execwatch.probe import loader
from tests.kernels.guest import EMULATED_TRIES, FOREIGN_TRIES, MISSING
from tests.support.kernels.vm import RELEASES, REPO, Boot, Kernel, Vm

BOOT_BUDGET_S = 600  # each guest, all at once under TCG; 371 s seen at a load average of 25
RECORD_KEYS = ("errno", "reason", "path", "count", "interpreter", "binary_arch", "comm", "detail")
GUEST_COMMAND = ".venv/bin/python -m tests.kernels.guest /tmp/out"


@dataclass
class Run:
    boot: Boot
    result: dict[str, Any]

    def records(self, case: str) -> list[dict[str, Any]]:
        path = self.result["cases"][case]
        return [r for r in self.result["records"] if r["path"] == path]

    def one(self, case: str, errno: str, reason: str) -> dict[str, Any]:
        """The case's one record, which must carry this errno and reason."""
        records = self.records(case)
        assert [(r["errno"], r["reason"]) for r in records] == [(errno, reason)], self
        return records[0]

    def __repr__(self) -> str:  # what pytest shows when an assertion about this run fails
        records = [{k: r.get(k) for k in RECORD_KEYS} for r in self.result.get("records", [])]
        return f"Run({self.boot.kernel.release} {self.boot.kernel.version}: {records})"

    def count(self, name: str) -> float:
        return float(self.result["kernel_counts"][name])


@pytest.fixture(scope="session")
def matrix() -> Iterator[dict[str, Run]]:
    kernels = [Kernel.fetched(release) for release in RELEASES]
    with tempfile.TemporaryDirectory(prefix="execwatch-kernels-") as tmp:
        vms = [Vm(k, GUEST_COMMAND, Path(tmp) / k.release) for k in kernels]
        try:
            boots = [vm.wait(BOOT_BUDGET_S) for vm in vms]
        finally:
            for vm in vms:
                vm.kill()
        yield {b.kernel.release: run_of(b) for b in boots}


def run_of(boot: Boot) -> Run:
    path = boot.out / "result.json"
    if boot.rc != 0 or not path.exists():
        return Run(boot, {})
    return Run(boot, json.loads(path.read_text()))


@pytest.fixture(params=RELEASES)
def run(request: pytest.FixtureRequest, matrix: dict[str, Run]) -> Run:
    result = matrix[request.param]
    assert result.result, f"the guest produced no result: {result.boot.explain()}"
    assert result.result["trace_rc"] == 0, result.boot.explain()
    return result


def test_each_kernel_is_the_one_fetched(run: Run) -> None:
    assert run.result["release"] == run.boot.kernel.version


def test_foreign_architecture_binary(run: Run) -> None:
    records = run.records("foreign")
    assert sum(r["count"] for r in records) == FOREIGN_TRIES, run
    for r in records:
        assert (r["errno"], r["reason"]) == ("ENOEXEC", "ForeignArchitecture"), run
        assert (r["binary_arch"], r["node_arch"]) == ("arm64", "amd64")
        assert r["comm"] == "python" and r["syscall"] == "execve"


def test_glibc_binary_in_a_musl_root(run: Run) -> None:
    r = run.one("glibc_in_musl_root", "ENOENT", "MissingInterpreter")
    assert r["interpreter"] == "/lib64/ld-linux-x86-64.so.2"
    assert r["comm"] == "sh"


def test_missing_shebang_interpreter(run: Run) -> None:
    r = run.one("missing_shebang_interpreter", "ENOENT", "MissingShebangInterpreter")
    assert r["interpreter"] == "/opt/nowhere/bash"


def test_missing_library_after_a_successful_exec(run: Run) -> None:
    """The early-death probe: glibc's loader exits 127 when a library is missing."""
    r = run.one("missing_library", "EXIT127", "MissingLibrary")
    assert r["library"] == MISSING
    assert r["exit_code"] == 127 and r["comm"] == "ls"


def test_an_emulated_binary_runs_and_is_reported(run: Run) -> None:
    """qemu-aarch64-static registered in the guest's binfmt_misc runs busybox: each exec
    succeeds, and trace reports them as Emulated, naming the emulator, counted exactly."""
    assert run.result["emulator_watched"], run
    assert run.result["emulated_runs"] == [[0, "emulated\n"]] * EMULATED_TRIES
    records = run.records("emulated")
    assert sum(r["count"] for r in records) == EMULATED_TRIES, run
    for r in records:
        assert (r["errno"], r["reason"]) == ("EMULATED", "Emulated"), run
        assert (r["binary_arch"], r["node_arch"]) == ("arm64", "amd64")
        assert r["interpreter"].endswith("/qemu-aarch64-static")
    emulated = 'execwatch_kernel_emulated_execs_total{emulated_arch="arm64"}'
    assert run.count(emulated) == EMULATED_TRIES, run


def test_kernel_counts_are_exact(run: Run) -> None:
    """The guest runs nothing else that fails: the kernel's counts are exactly the cases."""
    failures = 'execwatch_kernel_exec_failures_total{errno="%s"}'
    assert run.count(failures % "ENOEXEC") == FOREIGN_TRIES, run
    assert run.count(failures % "ENOENT") == 2, run
    assert run.count(failures % "EACCES") == 1, run  # guest.warm_up
    assert run.count('execwatch_kernel_early_deaths_total{status="EXIT127"}') == 1, run
    assert run.count('execwatch_kernel_dropped_total{type="ringbuf_full"}') == 0
    by_errno: dict[str, int] = {}
    for r in run.result["records"]:  # --show-not-found: every failure is printed
        by_errno[r["errno"]] = by_errno.get(r["errno"], 0) + r["count"]
    assert by_errno == {
        "ENOEXEC": FOREIGN_TRIES,
        "ENOENT": 2,
        "EACCES": 1,
        "EXIT127": 1,
        "EMULATED": EMULATED_TRIES,
    }


def test_compat_paths_match_the_kernel(run: Run) -> None:
    """bpf/compat.bpf.h falls back where a helper is missing; the loader says which."""
    features = probe_features(run.result["stderr"])
    major, minor = (int(x) for x in run.boot.kernel.version.split(".")[:2])
    for name in ("bpf_get_current_task_btf", "bpf_task_pt_regs"):
        since = loader.kernel_version(loader.KERNEL[name].since)  # compat.bpf.h's table
        assert features[name] == ((major, minor) >= since), name


def probe_features(stderr: list[str]) -> dict[str, bool]:
    [line] = [x for x in stderr if 'msg="probe attached"' in x]
    fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
    return {k: v == "True" for k, v in fields.items() if v in ("True", "False")}


SUPPORT_TABLE_DOCS = (REPO / "README.md", REPO / "docs/trace.md")
SUPPORT_HEADER = (
    "| Debian | Linux | failures caught and diagnosed | emulation detected | current task"
    " | syscall arguments |"
)


def support_row(run: Run) -> list[str]:
    """The support table's row for one kernel, from what the matrix observed there."""
    features = probe_features(run.result["stderr"])
    cases = sorted(
        {r["reason"] for case in run.result["cases"] for r in run.records(case)} - {"Emulated"}
    )
    exact = run.count('execwatch_kernel_exec_failures_total{errno="ENOEXEC"}') == FOREIGN_TRIES
    return [
        run.boot.kernel.release,
        ".".join(run.boot.kernel.version.split(".")[:2]),
        ", ".join(cases) + (", exact counts" if exact else ""),
        emulation_cell(run),
        "`bpf_get_current_task_btf`"
        if features["bpf_get_current_task_btf"]
        else "`bpf_get_current_task` + CO-RE reads",
        "`bpf_task_pt_regs`"
        if features["bpf_task_pt_regs"]
        else "saved registers at the top of the kernel stack",
    ]


def emulation_cell(run: Run) -> str:
    """yes (with exact counts) when every emulated exec was reported; else why not, as the
    probe logged it (`emulated execs not watched`)."""
    emulated = 'execwatch_kernel_emulated_execs_total{emulated_arch="arm64"}'
    reported = sum(r["count"] for r in run.records("emulated"))
    if reported == EMULATED_TRIES:
        exact = run.result["kernel_counts"].get(emulated) == EMULATED_TRIES
        return "yes" + (", exact counts" if exact else "")
    why = [x for x in run.result["stderr"] if "emulated execs not watched" in x]
    return f"no ({why[0].split('reason=', 1)[-1].strip()})" if why else "no"


def documented_rows(doc: Path) -> dict[str, list[str]]:
    lines = doc.read_text().splitlines()
    start = lines.index(SUPPORT_HEADER) + 2
    rows = itertools.takewhile(lambda line: line.startswith("|"), lines[start:])
    return {
        cells[0]: cells for cells in ([c.strip() for c in r.strip("|").split("|")] for r in rows)
    }


@pytest.mark.parametrize("doc", SUPPORT_TABLE_DOCS, ids=lambda p: p.name)
def test_support_table_is_what_the_matrix_saw(doc: Path, matrix: dict[str, Run]) -> None:
    """sid's row names the newest kernel when the docs were written: a newer one may run."""
    documented = documented_rows(doc)
    assert sorted(documented) == sorted(RELEASES)
    for release, run in matrix.items():
        assert run.result, run.boot.explain()
        observed, row = support_row(run), documented[release]
        if release == "sid":
            assert version_tuple(observed[1]) >= version_tuple(row[1].removeprefix("≥ "))
            observed[1] = row[1]
        assert row == observed, f"{doc.name}: update the {release} row to {observed}"


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split("."))
