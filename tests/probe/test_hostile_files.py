"""Unreadable or hostile files never hang or crash the diagnosis, nor lead it out of the root."""

from __future__ import annotations

import dataclasses
import errno
import os
import shutil
import stat
import subprocess
import time
from pathlib import Path

import pytest

from execwatch.diagnosis import FileDiagnoser
from execwatch.record import ExecFailed, Reason
from tests.probe.conftest import Children, Tracer


def event_for(path: str, err: int, pid: int | None = None) -> ExecFailed:
    pid = pid or os.getpid()
    return ExecFailed(
        time=time.time(), errno=err, pid=pid, tgid=pid, ppid=os.getppid(), uid=0,
        comm="t", parent_comm="p", path=path, cgroup_id=0,
        mntns=os.stat("/proc/self/ns/mnt").st_ino, syscall="execve",
    )  # fmt: skip


def test_fifo_is_not_opened_for_reading(tracer: Tracer, children: Children, tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o755)

    assert children.exec(str(fifo)) == errno.EACCES

    record = tracer.for_path(fifo)
    assert record.diagnosis.reason is Reason.PERMISSION_DENIED
    assert "not a regular file" in record.diagnosis.detail


def test_device_node_is_never_opened(tracer: Tracer, children: Children, tmp_path: Path) -> None:
    device = tmp_path / "zero"
    os.mknod(device, 0o755 | stat.S_IFCHR, os.makedev(1, 5))

    assert children.exec(str(device)) == errno.EACCES

    record = tracer.for_path(device)
    assert record.diagnosis.reason is Reason.PERMISSION_DENIED
    assert "not a regular file" in record.diagnosis.detail


def test_directory(tracer: Tracer, children: Children, tmp_path: Path) -> None:
    assert children.exec(str(tmp_path)) == errno.EACCES
    assert tracer.for_path(tmp_path).diagnosis.reason is Reason.PERMISSION_DENIED


def test_symlink_cannot_lead_the_diagnosis_out_of_the_root(
    tracer: Tracer, children: Children, foreign_root: Path, tmp_path: Path
) -> None:
    """Inside the root, the link names a file that only exists on the host: the kernel says
    ENOENT, and so must the diagnosis, instead of reading the host's arm64 binary."""
    host_binary = tmp_path / "host-only-arm64"
    shutil.copy(foreign_root / "arm64/root/usr/bin/busybox", host_binary)
    root = tmp_path / "root"
    (root / "app").mkdir(parents=True)
    (root / "app/run").symlink_to("/../../../.." + str(host_binary))

    assert children.exec("/app/run", root=root) == errno.ENOENT

    assert tracer.for_path("/app/run").diagnosis.reason is Reason.NOT_FOUND


def test_huge_sparse_binary_is_diagnosed_from_its_headers(
    tracer: Tracer, foreign_root: Path, tmp_path: Path
) -> None:
    binary = tmp_path / "huge"
    shutil.copy(foreign_root / "arm64/root/usr/bin/busybox", binary)
    with open(binary, "r+b") as f:
        f.truncate(64 << 30)  # 64 GiB, sparse
    with pytest.raises(OSError):
        subprocess.run([binary], check=False)
    started = time.monotonic()
    record = tracer.for_path(binary)
    assert record.diagnosis.reason is Reason.FOREIGN_ARCHITECTURE
    assert time.monotonic() - started < 5


def test_symlink_loop_is_undiagnosed_not_a_hang(tmp_path: Path) -> None:
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")

    diagnosis = FileDiagnoser().diagnose(event_for(str(tmp_path / "a"), errno.ENOEXEC))

    assert diagnosis.reason is Reason.UNDIAGNOSED
    assert "symbolic links" in diagnosis.detail


def test_gone_task_and_namespace_is_undiagnosed() -> None:
    event = dataclasses.replace(
        event_for("/bin/true", errno.ENOEXEC, pid=2**22 + 1), ppid=2**22 + 2, mntns=1
    )

    diagnosis = FileDiagnoser().diagnose(event)

    assert diagnosis.reason is Reason.UNDIAGNOSED
    assert "task is gone" in diagnosis.detail
