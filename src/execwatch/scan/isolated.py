"""Scan work that an image can make expensive, in a child process that can be killed.

Every parser and the linker run on budgets, but a budget is only as good as the code that
checks it; a child process with RLIMIT_AS and RLIMIT_CPU, and a wall-clock deadline
enforced from outside, stops whatever an image finds that the budgets missed. The child is
forked (nothing to pickle on the way in), sends its result back pickled through a pipe, and
exits. A child that dies, overruns or runs out of memory is `ScanKilled`: one line, like
every other input error.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from execwatch.rlimits import limit_cpu, limit_memory
from execwatch.scan.errors import ScanInputError

T = TypeVar("T")
MiB = 1 << 20


class ScanKilled(ScanInputError):
    """The scan's process was stopped: over its memory, CPU or time, or it crashed."""


@dataclass(frozen=True)
class ProcessLimits:
    memory: int = 4096 * MiB  # RLIMIT_AS on top of what the child inherits at fork
    cpu_s: int = 3600  # RLIMIT_CPU
    wall_s: float | None = None  # killed from outside past this; None: CPU and budgets only


def run_isolated(work: Callable[[], T], limits: ProcessLimits, what: str) -> T:
    """`work()` in a forked child within `limits`; its result, or what it raised."""
    return start_isolated(work, limits, what).result()


@dataclass
class Pending(Generic[T]):
    """A forked child's work under way: `result()` waits for it (once), `cancel()` kills it.
    Either reaps the child; an owner calls one of them whatever happens."""

    pid: int
    read_end: int
    limits: ProcessLimits
    what: str
    started: float
    status: int | None = None  # the child's wait status, once reaped

    def result(self) -> T:
        overran = True
        try:
            left = None if self.limits.wall_s is None else self.limits.wall_s - self._spent()
            data, overran = _collect(self.read_end, left)
        finally:
            self._reap(kill=overran)
        if overran:
            raise ScanKilled(f"{self.what}: killed after {self.limits.wall_s:g} s")
        assert self.status is not None
        result: T = _outcome(data, self.status, self.limits, self.what)
        return result

    def cancel(self) -> None:
        """Kill and reap the child, unless `result()` did already."""
        if self.status is None:
            self._reap(kill=True)

    def _spent(self) -> float:
        return time.monotonic() - self.started

    def _reap(self, kill: bool) -> None:
        os.close(self.read_end)
        if kill:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        _, self.status = os.waitpid(self.pid, 0)


def start_isolated(work: Callable[[], T], limits: ProcessLimits, what: str) -> Pending[T]:
    """`work()` started in a forked child within `limits`, while the caller goes on."""
    read_end, write_end = os.pipe()
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child; its outcome is asserted by the parent
        os.close(read_end)
        _child(work, limits, write_end)
    os.close(write_end)
    return Pending(pid, read_end, limits, what, started)


def _child(work: Callable[[], Any], limits: ProcessLimits, write_end: int) -> None:
    code = 0
    try:
        limit_memory(limits.memory)
        limit_cpu(limits.cpu_s)
        try:
            payload: tuple[str, Any] = ("ok", work())
        except MemoryError:
            payload, code = ("memory", None), 3
        except BaseException as exc:  # what the scan raised, re-raised in the parent
            payload = ("raised", _picklable(exc))
        data = pickle.dumps(payload)
        with os.fdopen(write_end, "wb") as out:
            out.write(data)
    except BaseException:
        code = 4
    finally:
        os._exit(code)


def _picklable(exc: BaseException) -> BaseException:
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:  # an exception that cannot cross: its text does
        return RuntimeError(f"{type(exc).__name__}: {exc}")
    return exc


def _collect(fd: int, wall_s: float | None) -> tuple[bytes, bool]:
    """Everything the child writes, until it closes the pipe; True when it overran."""
    deadline = None if wall_s is None else time.monotonic() + max(0.0, wall_s)
    chunks: list[bytes] = []
    while True:
        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, _, _ = select.select([fd], [], [], wait)
        if not ready:
            return b"", True
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks), False
        chunks.append(chunk)


def _outcome(data: bytes, status: int, limits: ProcessLimits, what: str) -> Any:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        cause = "over its CPU budget" if sig == signal.SIGXCPU else signal.Signals(sig).name
        raise ScanKilled(f"{what}: the scan's process was killed ({cause})")
    kind, value = pickle.loads(data) if data else ("lost", None)
    if kind == "ok":
        return value
    if kind == "raised" and isinstance(value, BaseException):
        raise value
    if kind == "memory":
        raise ScanKilled(f"{what}: over its memory budget ({limits.memory // MiB} MiB)")
    raise ScanKilled(f"{what}: the scan's process exited {os.WEXITSTATUS(status)} with no result")
