"""Failures spaced out in time, as a user retrying a command or a crash-looping container
makes them: every one is diagnosed, however long since the last one on its file system.

Idle diagnosis workers sleep in the kernel reading their pipe. That wait is not a file
system's: it never makes the mount of the worker's previous call look slow (issue 39).
The real probe on this kernel, the node stack with its consume loop, as trace and the
agent run it; real binaries from real packages.
"""

from __future__ import annotations

import errno
import math
import random
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from execwatch.node.stack import StackOptions
from execwatch.pipeline import PipelineOptions
from execwatch.record import ExecFailure, Reason, UndiagnosedCause
from tests.probe.conftest import Children
from tests.support.node.stack_runner import node_stack
from tests.support.probe.debian_roots import newer_package
from tests.support.wait import wait_until

FAILURES = 50
SHORTEST_S, LONGEST_S = 0.3, 3.0


@dataclass(frozen=True)
class Failure:
    path: str  # the record's path
    reason: Reason  # what it must be diagnosed as
    cause: Callable[[], None]  # makes the failure happen, now


def spacings(count: int, seed: int) -> list[float]:
    """Pauses between SHORTEST_S and LONGEST_S, log-uniform: as many short as long ones."""
    rng = random.Random(seed)
    low, high = math.log(SHORTEST_S), math.log(LONGEST_S)
    return [math.exp(rng.uniform(low, high)) for _ in range(count)]


class Failures:
    """Real failures of three kinds on one file system (this test's directory)."""

    def __init__(self, tmp_path: Path, foreign_root: Path, children: Children) -> None:
        self._dir = tmp_path / "bin"
        self._dir.mkdir()
        self._root = tmp_path / "root"  # a root holding glibc programs, and no ld.so
        (self._root / "app").mkdir(parents=True)
        self._arm64 = foreign_root / "arm64/root/usr/bin/hello"
        self._newer_hello = newer_package("hello") / "usr/bin/hello"  # needs GLIBC_2.38
        self._children = children

    def foreign(self, n: int) -> Failure:
        binary = self._dir / f"arm-{n}"
        shutil.copy(self._arm64, binary)
        return Failure(str(binary), Reason.FOREIGN_ARCHITECTURE, lambda: self._exec(binary))

    def missing_loader(self, n: int) -> Failure:
        shutil.copy("/usr/bin/true", self._root / f"app/true-{n}")
        path = f"/app/true-{n}"

        def cause() -> None:
            assert self._children.exec(path, root=self._root) == errno.ENOENT

        return Failure(path, Reason.MISSING_INTERPRETER, cause)

    def newer_glibc(self, n: int) -> Failure:
        binary = self._dir / f"hello-{n}"
        shutil.copy(self._newer_hello, binary)

        def cause() -> None:
            ran = subprocess.run([binary], capture_output=True, text=True, check=False)
            assert "GLIBC_2.38" in ran.stderr, ran.stderr

        return Failure(str(binary), Reason.MISSING_SYMBOL_VERSION, cause)

    def mixed(self, count: int) -> list[Failure]:
        kinds = (self.foreign, self.missing_loader, self.newer_glibc)
        return [kinds[n % len(kinds)](n) for n in range(count)]

    def _exec(self, binary: Path) -> None:
        assert self._children.exec(str(binary), linger=0.2) == errno.ENOEXEC


class Recorder:
    """The node stack with its consume loop, as trace runs it, into a list."""

    def __init__(self, records: list[ExecFailure]) -> None:
        self.records = records

    def by_path(self) -> dict[str, ExecFailure]:
        return {r.event.path: r for r in list(self.records)}

    def wait_for(self, paths: list[str], timeout: float) -> dict[str, ExecFailure]:
        def all_seen() -> dict[str, ExecFailure] | None:
            seen = self.by_path()
            return seen if all(p in seen for p in paths) else None

        def missing() -> str:
            return f"no record of {[p for p in paths if p not in self.by_path()]}"

        found: dict[str, ExecFailure] = wait_until(all_seen, timeout, explain=missing)
        return found


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    options = StackOptions(pipeline=PipelineOptions(window=0.05))
    with node_stack(options, loop="run") as running:
        yield Recorder(running.records)


@pytest.fixture
def failures(tmp_path: Path, foreign_root: Path, children: Children) -> Failures:
    return Failures(tmp_path, foreign_root, children)


def cause_spaced(sequence: list[Failure], seed: int) -> None:
    for failure, pause in zip(sequence, spacings(len(sequence), seed), strict=True):
        failure.cause()
        time.sleep(pause)


def wrongly_diagnosed(
    sequence: list[Failure], found: dict[str, ExecFailure]
) -> list[tuple[str, str, str, str]]:
    """(path, expected, got, detail) of each failure not diagnosed as expected."""
    wrong = []
    for failure in sequence:
        d = found[failure.path].diagnosis
        if d.reason is not failure.reason:
            wrong.append((failure.path, str(failure.reason), str(d.reason), d.detail))
    return wrong


def test_fifty_failures_spaced_out_on_a_healthy_file_system_are_all_diagnosed(
    recorder: Recorder, failures: Failures
) -> None:
    sequence = failures.mixed(FAILURES)
    assert {f.reason for f in sequence} == {
        Reason.FOREIGN_ARCHITECTURE,
        Reason.MISSING_INTERPRETER,
        Reason.MISSING_SYMBOL_VERSION,
    }

    cause_spaced(sequence, seed=39)

    found = recorder.wait_for([f.path for f in sequence], timeout=30)
    assert wrongly_diagnosed(sequence, found) == []


def test_a_hung_mount_is_refused_and_every_failure_elsewhere_still_diagnosed(
    recorder: Recorder, failures: Failures, children: Children, hung_mount: Path
) -> None:
    sequence = failures.mixed(FAILURES)
    hung: list[str] = []
    for step, (failure, pause) in enumerate(zip(sequence, spacings(FAILURES, 40), strict=True)):
        failure.cause()
        if step % 5 == 2:  # every fifth failure is followed by one on the hung mount
            hung.append(str(hung_mount / f"app-{step}"))
            assert children.exec(hung[-1], linger=0.5) == errno.ENOEXEC
        time.sleep(pause)

    found = recorder.wait_for([f.path for f in sequence] + hung, timeout=30)
    assert wrongly_diagnosed(sequence, found) == []
    refused = [found[path].diagnosis for path in hung]
    assert all(d.reason is Reason.UNDIAGNOSED for d in refused), refused
    assert all(str(hung_mount) in d.detail for d in refused), refused
    # The first one overran its budget there; the mount is not waited on again.
    assert refused[0].cause is UndiagnosedCause.OVERRAN, refused[0]
    assert {d.cause for d in refused[1:]} == {UndiagnosedCause.SLOW_MOUNT}, refused
