"""A real probe in this kernel, and helpers to cause real exec failures."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from execwatch.attribution import Attributor
from execwatch.attribution.mounts import cgroup_mounts
from execwatch.diagnosis import FileDiagnoser
from execwatch.pipeline import NodePipeline
from execwatch.probe import Probe
from execwatch.probe.events import boot_to_epoch_offset
from execwatch.record import ExecFailure


class Tracer:
    """Runs the node pipeline on the real probe and collects what it emits."""

    def __init__(self, probe: Probe, attributor: Attributor | None = None) -> None:
        self.probe = probe
        self.records: list[ExecFailure] = []
        self.pipeline = NodePipeline(
            FileDiagnoser.for_host(attributor),
            self.records.append,
            attributor=attributor,
            epoch_offset=boot_to_epoch_offset(),
            show_not_found=True,
            window=0.05,
        )
        probe.open_ring_buffer(self.pipeline.on_record)

    def close(self) -> None:
        self.pipeline.close()

    def wait_for(self, match: Callable[[ExecFailure], bool], timeout: float = 5.0) -> ExecFailure:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.probe.poll(50)
            for record in self.records:
                if match(record):
                    return record
        seen = [(r.event.path, r.event.errno, str(r.diagnosis.reason)) for r in self.records]
        raise AssertionError(f"no matching failed exec within {timeout}s; saw {seen[-20:]}")

    def for_path(self, path: str | Path, timeout: float = 5.0) -> ExecFailure:
        return self.wait_for(lambda r: r.event.path == str(path), timeout)


@pytest.fixture
def tracer() -> Iterator[Tracer]:
    with Probe() as probe:
        tracer = Tracer(probe)
        yield tracer
        tracer.close()


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
