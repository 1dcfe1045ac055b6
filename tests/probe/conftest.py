"""A real probe in this kernel, and helpers to cause real exec failures."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from execwatch.attribution import Attributor
from execwatch.attribution.mounts import cgroup_mounts
from execwatch.node.stack import StackOptions
from execwatch.pipeline import PipelineOptions
from execwatch.record import ExecFailure
from tests.support.node.stack_runner import Running, node_stack
from tests.support.wait import wait_until

HUNG_FUSE = Path(__file__).with_name("hung_fuse.py")


class Tracer:
    """The node stack on the real probe, polled by the test, and what it emitted."""

    def __init__(self, running: Running) -> None:
        self.probe = running.probe
        self.pipeline = running.pipeline
        self.records = running.records

    @classmethod
    @contextmanager
    def open(cls, attributor: Attributor | None = None) -> Iterator[Tracer]:
        options = StackOptions(
            pipeline=PipelineOptions(window=0.05, show_not_found=True, show_no_shebang=True),
            attributor=attributor,
        )
        with node_stack(options) as running:
            yield cls(running)

    def wait_for(self, match: Callable[[ExecFailure], bool], timeout: float = 5.0) -> ExecFailure:
        def found() -> ExecFailure | None:
            self.probe.poll(50)
            self.pipeline.flush()  # as the consume loop does each window: held fates expire
            return next((r for r in self.records if match(r)), None)

        def seen() -> str:
            seen = [(r.event.path, r.event.status, str(r.diagnosis.reason)) for r in self.records]
            return f"no matching failed exec; saw {seen[-20:]}"

        record: ExecFailure = wait_until(found, timeout, step=0, explain=seen)
        return record

    def for_path(self, path: str | Path, timeout: float = 5.0) -> ExecFailure:
        return self.wait_for(lambda r: r.event.path == str(path), timeout)


@pytest.fixture
def tracer() -> Iterator[Tracer]:
    with Tracer.open() as tracer:
        yield tracer


class Children:
    """Forks children that try one exec and then linger, like a shell whose command failed."""

    def __init__(self) -> None:
        self._pids: list[int] = []

    def exec(
        self,
        path: str | bytes,
        *,
        root: Path | None = None,
        via_fd: bool = False,
        linger: float = 1.0,
    ) -> int:
        """Returns the errno of the child's failed exec (0 if it succeeded)."""
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child never returns
            os.close(r)
            os.write(w, bytes([_try_exec(path, root, via_fd)]))
            time.sleep(linger)
            os._exit(0)
        os.close(w)
        code = os.read(r, 1)[0]
        os.close(r)
        self._pids.append(pid)
        return code

    def reap(self) -> None:
        for pid in self._pids:
            os.waitpid(pid, 0)
        self._pids.clear()


def _try_exec(path: str | bytes, root: Path | None, via_fd: bool) -> int:
    try:
        if root is not None:
            os.chroot(root)
            os.chdir("/")
        if via_fd:
            fd = os.open(path, os.O_RDONLY)
            os.execve(fd, [path], {})  # fexecve(3): execveat(fd, "", AT_EMPTY_PATH)
        os.execv(path, [path])
    except OSError as exc:
        return exc.errno or 0
    return 0


@pytest.fixture
def own_cgroup() -> Iterator[Path]:
    """A cgroup v2 directory of its own, so a test's failures can be counted apart."""
    unified = cgroup_mounts().unified
    assert unified is not None, "these tests need a cgroup v2 hierarchy"
    path = unified.mountpoint / f"execwatch-test-{os.getpid()}"
    path.mkdir()
    yield path
    path.rmdir()


@pytest.fixture
def children() -> Iterator[Children]:
    runner = Children()
    yield runner
    runner.reap()


@pytest.fixture
def hello_arm64(foreign_root: Path) -> Path:
    return foreign_root / "arm64/root/usr/bin/hello"


@pytest.fixture
def hung_mount(tmp_path: Path, hello_arm64: Path) -> Iterator[Path]:
    mountpoint = tmp_path / "hung"
    mountpoint.mkdir()
    daemon = subprocess.Popen(
        [sys.executable, HUNG_FUSE, mountpoint, hello_arm64, str(os.getpid())],
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 15
    while not os.path.ismount(mountpoint):
        if daemon.poll() is not None or time.monotonic() > deadline:
            daemon.kill()
            err = daemon.communicate()[1].decode(errors="replace")
            pytest.fail(f"the FUSE file system did not mount: {err[-2000:]}", pytrace=False)
        time.sleep(0.05)
    try:
        yield mountpoint
    finally:
        daemon.kill()  # blocked reads now fail with ENOTCONN; their threads end
        daemon.wait()
        subprocess.run(["umount", "-l", mountpoint], check=False, capture_output=True)
