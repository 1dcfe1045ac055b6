"""The node and the scan judge a file by the same rules: for each file a live task could
not exec, the node's diagnosis is the Reason the scan's check name spells."""

from __future__ import annotations

import errno
import functools
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from execwatch.binfmt import Platform
from execwatch.diagnosis import FileDiagnoser
from execwatch.record import ExecFailed, Reason
from execwatch.scan.runner import ScanOptions, scan
from execwatch.scan.vocabulary import REASON_OF_CHECK
from tests.support.binfmt.cbuild import HELLO_C, compile_c
from tests.support.wait import wait_until

# (root, file) -> the errno the kernel gives its exec, and the reason both must name
FILES = {
    ("app", "/app/arm"): (errno.ENOEXEC, Reason.FOREIGN_ARCHITECTURE),
    ("app", "/app/corrupt"): (errno.ENOEXEC, Reason.CORRUPT_BINARY),
    ("app", "/app/zsh.sh"): (errno.ENOENT, Reason.MISSING_SHEBANG_INTERPRETER),
    ("app", "/app/glibc"): (errno.ENOENT, Reason.MISSING_INTERPRETER),
    ("bad", "/app/glibc"): (errno.ELIBBAD, Reason.BAD_INTERPRETER),
    ("app", "/app/macos"): (errno.ENOEXEC, Reason.FOREIGN_OS),
    ("app", "/app/app.exe"): (errno.ENOEXEC, Reason.FOREIGN_OS),
}


def build_root(root: Path, foreign_root: Path, foreign_os: dict[str, Path], tmp: Path) -> None:
    """/app: a glibc program whose loader is absent, a macOS and a Windows build; /bad, a
    root of its own: one whose loader is not ELF."""
    hello = compile_c(tmp / "hello", HELLO_C, "gcc")
    for top in ("app", "bad"):
        (root / top / "app").mkdir(parents=True)
        shutil.copy(hello, root / top / "app/glibc")
    shutil.copy(foreign_root / "arm64/root/usr/bin/busybox", root / "app/app/arm")
    (root / "app/app/corrupt").write_bytes(b"\x7fELF\x02\x01\x01" + bytes(9))
    (root / "app/app/zsh.sh").write_bytes(b"#!/bin/zsh\n")
    shutil.copy(foreign_os["hello-darwin-arm64"], root / "app/app/macos")
    shutil.copy(foreign_os["hello-windows-amd64.exe"], root / "app/app/app.exe")
    (root / "bad/lib64").mkdir()
    (root / "bad/lib64/ld-linux-x86-64.so.2").write_bytes(b"not an ELF loader\n")
    for path in root.rglob("*"):
        if path.is_file():
            path.chmod(0o755)


@pytest.fixture
def roots(
    tmp_path: Path, foreign_root: Path, foreign_os: dict[str, Path]
) -> Iterator[dict[str, tuple[int, Path]]]:
    """A live task chrooted into each root, as a crash-looping container's would be."""
    build_root(tmp_path / "roots", foreign_root, foreign_os, tmp_path)
    tasks = {}
    for top in ("app", "bad"):
        root = tmp_path / "roots" / top
        pid = os.fork()
        if pid == 0:
            os.chroot(root)
            time.sleep(60)
            os._exit(0)
        tasks[top] = (pid, root)
    for pid, root in tasks.values():  # the child chroots after fork: seen once it has
        wait_until(functools.partial(chrooted, pid, root), timeout=10)
    try:
        yield tasks
    finally:
        for pid, _ in tasks.values():
            os.kill(pid, 9)
            os.waitpid(pid, 0)


def chrooted(pid: int, root: Path) -> bool:
    return os.stat(f"/proc/{pid}/root").st_ino == root.stat().st_ino


def failed_exec(pid: int, root: Path, path: str, err: int) -> ExecFailed:
    top = root.stat()
    return ExecFailed(
        time=time.time(), errno=err, pid=pid, tgid=pid, ppid=os.getpid(), uid=0, comm="app",
        parent_comm="sh", path=path, cgroup_id=0, mntns=os.stat("/proc/self/ns/mnt").st_ino,
        syscall="execve", root_ino=top.st_ino, root_dev=top.st_dev,
    )  # fmt: skip


def scanned(root: Path) -> dict[str, Reason]:
    options = ScanOptions(platforms=(Platform("linux", "amd64"),), root=True)  # a chroot
    (result,) = scan(str(root), options).results
    return {f.path: REASON_OF_CHECK[f.check] for f in result.findings}


def test_the_node_and_the_scan_name_the_same_reason(
    roots: dict[str, tuple[int, Path]],
) -> None:
    diagnoser = FileDiagnoser(node=Platform("linux", "amd64"))
    by_scan = {top: scanned(root) for top, (_, root) in roots.items()}
    for (top, path), (err, reason) in FILES.items():
        pid, root = roots[top]
        diagnosis = diagnoser.diagnose(failed_exec(pid, root, path, err))
        assert (diagnosis.reason, by_scan[top][path]) == (reason, reason), (top, path)
