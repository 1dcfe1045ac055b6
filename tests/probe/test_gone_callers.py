"""Callers that are gone before user space looks: the kernel event alone must find
their root and their file (issue 9, item 2). Real execs, real probe.

Each caller here exits at once, and GoneFirst holds the diagnosis until its process
has been reaped, so nothing can be read through /proc/PID: the race a busy node loses.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from execwatch.diagnosis import FileDiagnoser
from execwatch.node.stack import StackOptions
from execwatch.pipeline import PipelineOptions
from execwatch.record import Diagnosis, ExecFailed, ExecFailure, KernelEvent, Reason
from tests.support.node.stack_runner import Running, node_stack
from tests.support.wait import wait_until

GLIBC_LOADER = {"x86_64": "/lib64/ld-linux-x86-64.so.2", "aarch64": "/lib/ld-linux-aarch64.so.1"}
MUSL_LOADER = Path(f"/lib/ld-musl-{platform.machine()}.so.1")
AT_EMPTY_PATH = 0x1000


class GoneFirst:
    """Diagnoses only once the failing process no longer exists."""

    def __init__(self) -> None:
        self.inner = FileDiagnoser()

    def diagnose(self, event: KernelEvent) -> Diagnosis:
        deadline = time.monotonic() + 5
        while Path(f"/proc/{event.tgid}").exists():
            assert time.monotonic() < deadline, f"pid {event.tgid} never went away"
            time.sleep(0.01)
        return self.inner.diagnose(event)


class Records:
    def __init__(self, running: Running) -> None:
        self.probe = running.probe
        self.seen = running.records

    def of(self, path: str, timeout: float = 10.0) -> ExecFailure:
        def found() -> ExecFailure | None:
            self.probe.poll(50)
            return next((r for r in self.seen if r.event.path == path), None)

        def seen() -> str:
            return f"no record of {path}; saw {[r.event.path for r in self.seen]}"

        record: ExecFailure = wait_until(found, timeout, step=0, explain=seen)
        return record


@pytest.fixture
def records() -> Iterator[Records]:
    options = StackOptions(pipeline=PipelineOptions(window=0.05), diagnoser=GoneFirst())
    with node_stack(options) as running:
        yield Records(running)


def exit_after_exec(call: Callable[..., int], *args: object) -> int:
    """Fork a child that makes one exec call and exits at once; reap it; its errno."""
    pid = os.fork()
    if pid == 0:
        call(*args)
        os._exit(ctypes.get_errno() & 0xFF)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def libc_call(name: str) -> Callable[..., int]:
    function: Callable[..., int] = getattr(ctypes.CDLL(None, use_errno=True), name)
    return function


def argv(*args: bytes) -> ctypes.Array[ctypes.c_char_p]:
    return (ctypes.c_char_p * (len(args) + 1))(*args, None)


def test_a_chrooted_shell_that_execs_a_glibc_binary_in_a_musl_root(
    records: Records, tmp_path: Path
) -> None:
    """The second seed's own case: `chroot ROOT /bin/sh -c /app/glibc-binary`."""
    root = tmp_path / "alpine-like"
    for d in ("bin", "lib", "app"):
        (root / d).mkdir(parents=True)
    shutil.copy("/bin/busybox", root / "bin/sh")  # static, like alpine's
    shutil.copy(MUSL_LOADER.resolve(), root / "lib" / MUSL_LOADER.name)
    shutil.copy("/usr/bin/true", root / "app/glibc-binary")

    run = subprocess.run(
        ["chroot", root, "/bin/sh", "-c", "/app/glibc-binary"], capture_output=True, text=True
    )
    assert run.returncode == 127, run.stderr

    record = records.of("/app/glibc-binary")
    assert isinstance(record.event, ExecFailed)
    assert record.event.comm == "sh"
    assert record.event.root_path == str(root)
    assert record.diagnosis.reason is Reason.MISSING_INTERPRETER, record.diagnosis
    assert record.diagnosis.interpreter == GLIBC_LOADER[platform.machine()]


def test_a_pivot_rooted_caller_gone_with_its_mount_namespace(
    records: Records, tmp_path: Path
) -> None:
    """A container's case without a runtime that keeps its rootfs mounted: the caller
    pivot_root'ed into a directory in a mount namespace of its own and exited, and the
    namespace went with it. Its root's path in its namespace is "/", which says nothing;
    its place in its file system, through a mount of that device, finds it again."""
    root = tmp_path / "bundle-rootfs"
    for d in ("bin", "app", "old"):
        (root / d).mkdir(parents=True)
    shutil.copy("/bin/busybox", root / "bin/busybox")  # static
    shutil.copy("/usr/bin/true", root / "app/glibc-binary")  # its loader is not in the root
    inside = "/bin/busybox umount -l /old; exec /app/glibc-binary"
    run = subprocess.run(
        [
            "unshare", "--mount", "--propagation", "private", "sh", "-c",
            f'mount --bind {root} {root} && cd {root} && pivot_root . old'
            f' && exec /bin/busybox sh -c "{inside}"',
        ],
        capture_output=True,
        text=True,
    )  # fmt: skip
    assert run.returncode == 127, run.stderr

    record = records.of("/app/glibc-binary")
    assert isinstance(record.event, ExecFailed)
    assert record.event.mntns != os.stat("/proc/self/ns/mnt").st_ino
    assert record.event.root_path == "/"
    assert record.event.root_fs_path == str(root)  # tmp_path is on the root file system
    assert record.diagnosis.reason is Reason.MISSING_INTERPRETER, record.diagnosis
    assert record.diagnosis.interpreter == GLIBC_LOADER[platform.machine()]


def test_a_chroot_that_was_replaced_is_not_trusted(records: Records, tmp_path: Path) -> None:
    """The recorded path now names another directory: no diagnosis against it."""
    root = tmp_path / "jail"
    (root / "app").mkdir(parents=True)
    shutil.copy("/usr/bin/true", root / "app/tool")
    mover = subprocess.Popen(
        ["sh", "-c", f"chroot {root} /app/tool; mv {root} {root}.old; mkdir -p {root}/app"]
    )
    assert mover.wait() == 0

    record = records.of("/app/tool")
    assert isinstance(record.event, ExecFailed)
    assert record.event.root_path == str(root)
    assert record.diagnosis.reason is Reason.UNDIAGNOSED


def test_execveat_resolves_a_relative_name_against_dirfd(
    records: Records, foreign_root: Path, tmp_path: Path
) -> None:
    (tmp_path / "cwd").mkdir()
    (tmp_path / "dir").mkdir()
    shutil.copy(foreign_root / "s390x/root/usr/bin/busybox", tmp_path / "cwd/tool")
    shutil.copy(foreign_root / "arm64/root/usr/bin/hello", tmp_path / "dir/tool")
    dirfd = os.open(tmp_path / "dir", os.O_RDONLY | os.O_DIRECTORY)
    here = os.getcwd()
    os.chdir(tmp_path / "cwd")
    try:
        err = exit_after_exec(libc_call("execveat"), dirfd, b"tool", argv(b"tool"), argv(), 0)
    finally:
        os.chdir(here)
        os.close(dirfd)
    assert err == errno.ENOEXEC

    record = records.of("tool")
    assert isinstance(record.event, ExecFailed)
    assert record.event.syscall == "execveat"
    assert record.event.base_path == str(tmp_path / "dir")
    assert record.diagnosis.reason is Reason.FOREIGN_ARCHITECTURE
    assert record.diagnosis.binary_arch == "arm64"  # the cwd's tool is s390x


def test_a_relative_execve_resolves_against_the_cwd_it_had(
    records: Records, foreign_root: Path, tmp_path: Path
) -> None:
    shutil.copy(foreign_root / "ppc64el/root/usr/bin/hello", tmp_path / "tool")
    here = os.getcwd()
    os.chdir(tmp_path)
    try:
        err = exit_after_exec(libc_call("execve"), b"./tool", argv(b"./tool"), argv())
    finally:
        os.chdir(here)
    assert err == errno.ENOEXEC

    record = records.of("./tool")
    assert isinstance(record.event, ExecFailed)
    assert record.event.base_path == str(tmp_path)
    assert record.diagnosis.binary_arch == "ppc64le"


def test_fexecve_of_a_foreign_binary_by_a_process_that_exits_at_once(
    records: Records, foreign_root: Path, tmp_path: Path
) -> None:
    binary = tmp_path / "riscv-tool"
    shutil.copy(foreign_root / "riscv64/root/usr/bin/busybox", binary)
    fd = os.open(binary, os.O_RDONLY)
    try:
        err = exit_after_exec(libc_call("fexecve"), fd, argv(b"tool"), argv())
    finally:
        os.close(fd)
    assert err == errno.ENOEXEC

    record = records.of(binary.name)
    assert isinstance(record.event, ExecFailed)
    assert record.event.via_fd
    assert record.event.base_path == str(binary)
    assert (record.event.base_dev, record.event.base_ino) == (
        binary.stat().st_dev,
        binary.stat().st_ino,
    )
    assert record.diagnosis.reason is Reason.FOREIGN_ARCHITECTURE
    assert record.diagnosis.binary_arch == "riscv64"
