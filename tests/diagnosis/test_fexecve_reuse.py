"""fexecve of a caller that is gone: a new process under the same pid holds other files
behind the same fd number, and the diagnosis must not read them."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

from execwatch.diagnosis import FileDiagnoser
from execwatch.record import ExecFailed, Reason


def fexecve_event(fd: int, recorded: os.stat_result) -> ExecFailed:
    """The record of an fexecve by this very process, as if its pid had been reused: the
    kernel recorded `recorded` as the fd's file."""
    top = os.stat("/")
    return ExecFailed(
        time=time.time(), errno=errno.ENOEXEC, pid=os.getpid(), tgid=os.getpid(),
        ppid=os.getppid(), uid=0, comm="t", parent_comm="p", path="app", cgroup_id=0,
        mntns=os.stat("/proc/self/ns/mnt").st_ino, syscall="execveat", dirfd=fd,
        flags=0x1000, via_fd=True, root_ino=top.st_ino, root_dev=top.st_dev,
        base_ino=recorded.st_ino, base_dev=recorded.st_dev,
    )  # fmt: skip


def test_the_fd_of_a_reused_pid_is_not_read(foreign_root: Path, tmp_path: Path) -> None:
    """The pid's fd now holds an arm64 binary, but the kernel recorded another file: the
    diagnosis says the caller's file is gone, never ForeignArchitecture."""
    other = tmp_path / "recorded"
    other.write_bytes(b"#!/bin/sh\n")
    fd = os.open(foreign_root / "arm64/root/usr/bin/busybox", os.O_RDONLY)
    try:
        diagnosis = FileDiagnoser().diagnose(fexecve_event(fd, other.stat()))
        same = FileDiagnoser().diagnose(fexecve_event(fd, os.fstat(fd)))
    finally:
        os.close(fd)
    assert diagnosis.reason is Reason.UNDIAGNOSED, diagnosis
    assert same.reason is Reason.FOREIGN_ARCHITECTURE, "the very file is still read"
