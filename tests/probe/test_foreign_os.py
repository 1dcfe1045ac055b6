"""Executables of another OS on this host: the kernel refuses each (ENOEXEC, or ENOENT for
a loader Linux lacks) and the real probe names it ForeignOS, with the OS and architecture
found. Real Go cross-compiles (dev/build-foreign-os.sh), and a universal Mach-O of two."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from execwatch.node.output import human_line
from execwatch.record import ExecFailed, Reason
from tests.probe.conftest import Tracer
from tests.support.binfmt.foreignos import universal

REFUSED = {  # cached build -> (errno, binary_arch, the detail)
    "hello-darwin-amd64": (
        errno.ENOEXEC, "amd64", "a macOS x86-64 executable (Mach-O): built with GOOS=darwin?"
    ),
    "hello-darwin-arm64": (
        errno.ENOEXEC, "arm64", "a macOS arm64 executable (Mach-O): built with GOOS=darwin?"
    ),
    "hello-windows-amd64.exe": (
        errno.ENOEXEC, "amd64", "a Windows x86-64 executable (PE): built with GOOS=windows?"
    ),
    # Dynamically linked against /usr/libexec/ld.so, which no Linux root has.
    "hello-openbsd-amd64": (
        errno.ENOENT, "amd64", "an OpenBSD x86-64 executable (ELF): built with GOOS=openbsd?"
    ),
}  # fmt: skip


def refused_exec(path: Path) -> int:
    with pytest.raises(OSError) as failed:
        subprocess.run([path], check=False)
    return failed.value.errno or 0


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_another_os_executable_is_named_foreign_os(
    tracer: Tracer, foreign_os: dict[str, Path], tmp_path: Path, name: str
) -> None:
    binary = tmp_path / name
    shutil.copy(foreign_os[name], binary)
    want_errno, arch, detail = REFUSED[name]

    assert refused_exec(binary) == want_errno

    record = tracer.for_path(binary)
    assert isinstance(record.event, ExecFailed) and record.event.errno == want_errno
    assert record.event.ppid == os.getpid()
    assert record.diagnosis.reason is Reason.FOREIGN_OS, record.diagnosis
    assert (record.diagnosis.binary_arch, record.diagnosis.detail) == (arch, detail)
    line = human_line(record)
    assert f" ForeignOS {binary} pid=" in line and line.endswith(f" — {detail}")


def test_a_universal_mach_o_is_named_with_both_slices(
    tracer: Tracer, foreign_os: dict[str, Path], tmp_path: Path
) -> None:
    binary = tmp_path / "hello-universal"
    slices = (foreign_os[f"hello-darwin-{a}"].read_bytes() for a in ("amd64", "arm64"))
    binary.write_bytes(universal(*slices))
    binary.chmod(0o755)

    assert refused_exec(binary) == errno.ENOEXEC

    record = tracer.for_path(binary)
    assert record.diagnosis.reason is Reason.FOREIGN_OS
    assert record.diagnosis.binary_arch == "amd64+arm64"
    assert record.diagnosis.detail == (
        "a macOS universal executable (Mach-O: x86-64 and arm64): built with GOOS=darwin?"
    )
