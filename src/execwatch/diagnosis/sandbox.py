"""Diagnosis in worker processes that can really be stopped.

Diagnosis reads tenant files (ELF headers, the linker's search): a hostile binary can make
it run long or allocate without bound. A Python thread cannot be stopped, so each call runs
in one of a few worker processes, forked once from the agent and reused: the parent sends
the decoded KernelEvent, the worker reads the task's root through /proc and answers the
Diagnosis (both plain dataclasses, pickled). Each worker has RLIMIT_AS (the address space it
inherited plus `memory`) and, per call, RLIMIT_CPU. The parent kills (SIGKILL) a worker
whose call overran its deadline and starts another in its place; the call is reported
Undiagnosed with the cause. A worker blocked in the kernel (a read on a hung FUSE or NFS
mount) cannot die until the read returns: it is left to the kernel and does not count
towards capacity. Attribution and folding stay in the parent.

Workers are forked from the (multi-threaded) agent: a worker touches only the diagnoser,
its SlowMounts and its pipe, so a lock another thread held at fork time can at worst hang
that worker, which is then killed at its deadline like any other.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import gc
import logging
import math
import mmap
import os
import signal
import struct
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection, Pipe, wait
from multiprocessing.reduction import recv_handle, send_handle
from typing import Protocol, runtime_checkable

from execwatch.diagnosis.budget import Attempt, Refusal, SlowMounts, Wait, process_wait
from execwatch.probe import caps
from execwatch.probe.caps import confine
from execwatch.record import Diagnosis, KernelEvent, UndiagnosedCause, undiagnosed
from execwatch.rlimits import limit_cpu, limit_memory

log = logging.getLogger(__name__)

MiB = 1024 * 1024
START_TIMEOUT_S = 5.0
RETRY_START_S = 1.0  # while capacity is gone, at most one start attempt per this long
WORKER_NAME = "ew-diagnosis"  # its comm, as ps and /proc/PID/status show it
# Where a worker is: (since, mount id) of the last mount its current call entered, in
# memory it shares with the agent, read only when it looks stuck: no message (no wakeup)
# per file opened. The worker zeroes it before it answers: an idle worker is nowhere.
WHERE = struct.Struct("dQ")
# What a worker may still do: open /proc/PID/root of any task, and read files in
# directories only their owner may search. Not BPF, PERFMON, nor anything the agent's
# container was given for other parts (docs/privileges.md).
WORKER_CAPABILITIES = frozenset({caps.CAP_SYS_PTRACE, caps.CAP_DAC_READ_SEARCH})
# A call running (not blocked in the kernel) is killed only after this many budgets.
STARVED_FACTOR = 10


class Diagnoser(Protocol):
    def diagnose(self, event: KernelEvent) -> Diagnosis: ...


@runtime_checkable
class Preparing(Protocol):
    """A diagnoser with a step that runs in the agent, before the event crosses to a
    worker: the worker's copy of the agent's state is as old as the worker."""

    def prepare(self, event: KernelEvent) -> KernelEvent: ...


@dataclass(frozen=True)
class SandboxLimits:
    """What one worker may use. `memory`: address space on top of what it inherited from
    the agent at fork (RLIMIT_AS); `cpu_s`: CPU seconds per call (RLIMIT_CPU, reset before
    each call), 0 for the wall-clock deadline plus one second."""

    memory: int = 128 * MiB  # the chart's agent pod has 200 MiB in all
    cpu_s: int = 0


@dataclass(frozen=True)
class SandboxResult:
    """A diagnosis, and when its worker was killed, the overrun's stage label (metrics)."""

    diagnosis: Diagnosis
    killed: str = ""


@dataclass(eq=False)
class _Worker:
    pid: int
    pidfd: int  # readable once the process has exited
    conn: Connection
    where: mmap.mmap  # WHERE, written by the worker
    attempt: Attempt | None = None  # the call it runs

    def entered(self) -> tuple[float, int]:
        """(since, mount id) of the mount its call entered last; mount id 0: none yet, or
        no call running."""
        since, mount_id = WHERE.unpack_from(self.where)
        return float(since), int(mount_id)

    def exited(self) -> bool:
        """Reaps it if it has exited."""
        try:
            done, _ = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            return True
        return done != 0

    def status(self) -> int | None:
        """Its exit status (waitpid's), or None while it runs; reaps it."""
        try:
            done, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            return None
        return status if done else None

    def release(self) -> None:
        self.conn.close()
        os.close(self.pidfd)
        self.where.close()


class DiagnosisPool:
    """`size` worker processes for `diagnoser`; thread-safe. Call close() when done."""

    def __init__(
        self,
        diagnoser: Diagnoser,
        *,
        size: int = 2,
        budget: float = 1.0,
        slow: SlowMounts | None = None,
        limits: SandboxLimits = SandboxLimits(),
        max_stuck: int = 8,
    ) -> None:
        self._diagnoser = diagnoser
        self._size = size
        self._budget = budget
        self._slow = slow
        self._limits = limits
        self._max_stuck = max_stuck
        self._cond = threading.Condition()
        self._idle: list[_Worker] = []
        self._busy: set[_Worker] = set()
        self._live = 0  # idle or busy, not killed
        self._dying: list[_Worker] = []  # killed, not reaped yet (blocked in the kernel)
        self._closed = False
        self._last_error = ""
        self._next_start = 0.0
        for _ in range(size):
            self._replace()

    @property
    def deadline(self) -> float:
        return self._budget * STARVED_FACTOR

    def live(self) -> int:
        with self._cond:
            return self._live

    def problem(self) -> str | None:
        """None while at least one worker is alive or one could be started (the health check,
        which also reaps killed workers that took long to die)."""
        self._reap()
        self._prune_idle()
        with self._cond:
            if self._live or self._closed:
                return None
        self._replace()
        with self._cond:
            if self._live:
                return None
            return f"no diagnosis worker is alive and none could be started: {self._last_error}"

    def diagnose(self, event: KernelEvent) -> SandboxResult:
        worker = self._borrow()
        if worker is None:
            return SandboxResult(self._unavailable())
        now = time.monotonic()
        attempt = Attempt(tid=worker.pid, since=now, started=now)
        refusals: tuple[Refusal, ...] = ()
        if self._slow is not None:  # the other calls' waits, before this one is tracked
            self._locate_busy(self._slow)
            refusals = self._slow.refusals()
            self._slow.track(attempt)
        worker.attempt = attempt
        try:
            if isinstance(self._diagnoser, Preparing):
                event = self._diagnoser.prepare(event)
            try:
                worker.conn.send((event, refusals))
                if event.root_fd >= 0:  # the worker gets its own copy of the open root
                    send_handle(worker.conn, event.root_fd, worker.pid)
            finally:
                if event.root_fd >= 0:
                    os.close(event.root_fd)
            outcome, healthy = self._await(worker)
        except OSError as exc:  # the worker's end is gone: it died between calls
            outcome = self._death(worker, exc)
            healthy = False
        finally:
            worker.attempt = None
            if self._slow is not None:
                self._slow.untrack(attempt)
        if healthy:
            self._give_back(worker)
        else:
            with self._cond:
                self._busy.discard(worker)
                self._live -= 1
            self._retire(worker)
            self._replace()
        return outcome

    def _unavailable(self) -> Diagnosis:
        problem = self.problem()
        if problem is None:
            return undiagnosed(UndiagnosedCause.STOPPING, "not diagnosed: stopping")
        return undiagnosed(UndiagnosedCause.NO_WORKER, f"not diagnosed: {problem}")

    def close(self) -> None:
        """Stops idle workers and kills busy ones (their calls are reported as stopped);
        never waits for one blocked in the kernel."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._live -= len(idle)
            busy = list(self._busy)
            self._cond.notify_all()
        for worker in busy:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.pid, signal.SIGKILL)
        for worker in idle:
            with contextlib.suppress(OSError):
                worker.conn.send(None)
        deadline = time.monotonic() + 1.0
        for worker in idle:
            wait([worker.pidfd], max(0.0, deadline - time.monotonic()))
            self._retire(worker)
        self._reap()

    def _borrow(self) -> _Worker | None:
        while True:
            with self._cond:
                if self._closed:
                    return None
                if self._idle:
                    worker = self._idle.pop()
                    self._busy.add(worker)
                    return worker
                short = self._live < self._size
                if not short:
                    self._cond.wait(0.5)
                    continue
            self._replace()
            with self._cond:
                if not self._idle and not self._live:
                    return None  # capacity is gone: the caller reports it, never waits

    def _locate_busy(self, slow: SlowMounts) -> None:
        """Where the calls running now have waited long enough to make their mount
        suspect (a mount entered before a call began is not that call's)."""
        now = time.monotonic()
        with self._cond:
            busy = [w for w in self._busy if w.attempt is not None]
        for worker in busy:
            since, mount_id = worker.entered()
            attempt = worker.attempt
            if attempt is None or not mount_id or since < attempt.started:
                continue
            if now - since <= slow.suspect_after:
                continue
            if attempt.mount is None or attempt.mount.mount_id != mount_id:
                attempt.mount = slow.mount_by_id(mount_id)
            attempt.since = since

    def _give_back(self, worker: _Worker) -> None:
        with self._cond:
            self._busy.discard(worker)
            if not self._closed:
                self._idle.append(worker)
                self._cond.notify()
                return
            self._live -= 1
        with contextlib.suppress(OSError):
            worker.conn.send(None)
        self._retire(worker)

    def _retire(self, worker: _Worker) -> None:
        """Kills it (if alive) and reaps it, or leaves it to the kernel if it cannot die yet."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker.pid, signal.SIGKILL)
        wait([worker.pidfd], 0.05)
        if worker.exited():
            worker.release()
            return
        with self._cond:
            self._dying.append(worker)

    def _prune_idle(self) -> None:
        """Forgets idle workers that died (killed from outside: the OOM killer) and
        replaces them."""
        with self._cond:
            dead = [w for w in self._idle if wait([w.pidfd], 0)]
            for worker in dead:
                self._idle.remove(worker)
                self._live -= 1
        for worker in dead:
            log.warning("a diagnosis worker died idle", extra={"kv": {"pid": worker.pid}})
            self._retire(worker)
        if dead:
            self._replace()

    def _reap(self) -> None:
        with self._cond:
            dying = list(self._dying)
        for worker in dying:
            if worker.exited():
                worker.release()
                with self._cond:
                    self._dying.remove(worker)

    def _replace(self) -> None:
        """Brings the pool back to `size` live workers, if it may and can."""
        self._reap()
        while self._reserve():
            try:
                worker = self._start()
            except OSError as exc:
                with self._cond:
                    self._live -= 1
                    self._last_error = f"starting one failed: {exc.strerror or exc}"
                    self._next_start = time.monotonic() + RETRY_START_S
                log.error("cannot start a diagnosis worker", extra={"kv": {"error": str(exc)}})
                return
            with self._cond:
                self._next_start = 0.0
                self._idle.append(worker)
                self._cond.notify()

    def _reserve(self) -> bool:
        """Counts a worker about to start, if the pool may start one now."""
        with self._cond:
            if self._closed or self._live >= self._size:
                return False
            if len(self._dying) > self._max_stuck:
                self._last_error = f"{len(self._dying)} killed workers are stuck in the kernel"
                return False
            if time.monotonic() < self._next_start:
                return False
            self._live += 1
            return True

    def _start(self) -> _Worker:
        parent, child = Pipe()
        where = mmap.mmap(-1, WHERE.size)  # anonymous and shared: written by the child
        with self._cond:
            inherited = [w.conn for w in [*self._idle, *self._busy, *self._dying]]
        try:
            pid = os.fork()
        except OSError:
            parent.close()
            child.close()
            where.close()
            raise
        if pid == 0:  # the worker: never returns into the agent's code
            code = 70
            try:
                for conn in [parent, *inherited]:
                    conn.close()
                code = _serve(
                    child, where, self._diagnoser, self._slow, self._limits, self.deadline
                )
            finally:
                os._exit(code)
        child.close()
        worker = _Worker(pid, os.pidfd_open(pid), parent, where)
        if wait([parent, worker.pidfd], START_TIMEOUT_S) and parent.poll():
            try:
                if parent.recv() == "ready":
                    return worker
            except EOFError:
                pass
        status = worker.status()
        self._retire(worker)
        why = _status_text(status) if status is not None else "no answer"
        raise OSError(errno.ECHILD, f"the worker did not start ({why})")

    def _await(self, worker: _Worker) -> tuple[SandboxResult, bool]:
        """The worker's answer, or why it was killed; healthy: it may be reused."""
        period = min(0.1, self._budget / 4)
        started = time.monotonic()
        while True:
            ready = wait([worker.conn, worker.pidfd], period)
            if worker.conn in ready:
                try:
                    message = worker.conn.recv()
                except EOFError:
                    message = None
                if message is not None:
                    return self._answer(message)
            if ready:  # exited, nothing more to read
                return self._death(worker), False
            age = time.monotonic() - started
            if age <= self._budget:
                continue
            held = process_wait(worker.pid)
            if held is not Wait.RUNNING:  # it will not hurry: give up on it now
                return self._blocked(worker, on_files=held is Wait.FILES), False
            if age > self.deadline:
                cause = f"diagnosis killed: over {self.deadline:g} s"
                log.warning("diagnosis killed", extra={"kv": {"cause": cause}})
                return SandboxResult(
                    undiagnosed(UndiagnosedCause.KILLED, cause), "diagnosis"
                ), False

    def _answer(self, message: object) -> tuple[SandboxResult, bool]:
        match message:
            case ("done", Diagnosis() as diagnosis):
                return SandboxResult(diagnosis), True
            case ("failed", str(text)):
                failed = undiagnosed(UndiagnosedCause.FAILED, f"diagnosis failed: {text}")
                return SandboxResult(failed), True
            case ("memory", int(limit)):
                cause = f"diagnosis killed: over its memory budget ({limit // MiB} MiB)"
                log.warning("diagnosis killed", extra={"kv": {"cause": cause}})
                return SandboxResult(
                    undiagnosed(UndiagnosedCause.KILLED, cause), "diagnosis_memory"
                ), False
        return SandboxResult(
            undiagnosed(UndiagnosedCause.FAILED, f"diagnosis failed: bad answer {message!r:.80}")
        ), False

    def _blocked(self, worker: _Worker, *, on_files: bool) -> SandboxResult:
        _, mount_id = worker.entered()
        on_mount = on_files and mount_id
        mount = self._slow.mount_by_id(mount_id) if self._slow and on_mount else None
        where = f" in {mount}" if mount else ""
        cause = f"diagnosis overran its {self._budget:g} s budget{where}"
        log.warning("budget overran", extra={"kv": {"cause": cause}})
        if mount is not None and self._slow is not None:
            self._slow.mark(mount)
            cause += "; later events there are not waited for"
        return SandboxResult(undiagnosed(UndiagnosedCause.OVERRAN, cause), "diagnosis")

    def _death(self, worker: _Worker, exc: OSError | None = None) -> SandboxResult:
        """Why a worker ended without answering (killed by close(): not counted)."""
        if self._closed:
            return SandboxResult(undiagnosed(UndiagnosedCause.STOPPING, "not diagnosed: stopping"))
        wait([worker.pidfd], 0.5)
        status = worker.status()
        if status is not None and os.WIFSIGNALED(status):
            if os.WTERMSIG(status) == signal.SIGXCPU:
                cause = f"diagnosis killed: over its CPU budget ({self._cpu_s()} s)"
                return SandboxResult(undiagnosed(UndiagnosedCause.KILLED, cause), "diagnosis_cpu")
            if os.WTERMSIG(status) == signal.SIGKILL:
                cause = "diagnosis killed by SIGKILL (out of memory?)"
                return SandboxResult(
                    undiagnosed(UndiagnosedCause.KILLED, cause), "diagnosis_memory"
                )
        if status is None:
            cause = f"diagnosis failed: the worker's pipe broke ({exc})"
        else:
            cause = f"diagnosis worker died ({_status_text(status)})"
        return SandboxResult(undiagnosed(UndiagnosedCause.KILLED, cause), "diagnosis_crash")

    def _cpu_s(self) -> int:
        return self._limits.cpu_s or math.ceil(self.deadline) + 1


def _status_text(status: int) -> str:
    if os.WIFSIGNALED(status):
        return signal.Signals(os.WTERMSIG(status)).name
    return f"exit code {os.waitstatus_to_exitcode(status)}"


def _serve(
    conn: Connection,
    where: mmap.mmap,
    diagnoser: Diagnoser,
    slow: SlowMounts | None,
    limits: SandboxLimits,
    deadline: float,
) -> int:
    """The worker's loop: one event in, one answer out, until the parent says None."""
    gc.freeze()  # the agent's objects: never traversed here, so their pages stay shared
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's ^C is the parent's to handle
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    with contextlib.suppress(OSError), open("/proc/self/comm", "w") as comm:
        comm.write(WORKER_NAME)
    # The pod's memory limit counts the workers too: the OOM killer takes a worker (the
    # agent replaces it) before the agent. Raising the score needs no capability.
    with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as score:
        score.write("1000")
    confine(WORKER_CAPABILITIES)
    limit_memory(limits.memory)
    memory = limits.memory
    cpu_s = limits.cpu_s or math.ceil(deadline) + 1
    if slow is not None:  # CLOCK_MONOTONIC is the whole system's: the agent reads `since`
        slow.after_fork(lambda mount: WHERE.pack_into(where, 0, time.monotonic(), mount.mount_id))
    conn.send("ready")
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return 0
        if job is None:
            return 0
        event, refusals = job
        if event.root_fd >= 0:
            event = dataclasses.replace(event, root_fd=recv_handle(conn))
        if slow is not None:
            slow.adopt(refusals)
        limit_cpu(cpu_s)
        try:
            answer: tuple[str, object] = ("done", diagnoser.diagnose(event))
        except MemoryError:
            answer = ("memory", memory)
        except Exception as exc:  # a bug degrades this record only
            log.exception("diagnosis failed", extra={"kv": {"path": event.path}})
            answer = ("failed", repr(exc))
        finally:
            WHERE.pack_into(where, 0, 0.0, 0)  # the call is over: it is in no mount now
            if event.root_fd >= 0:
                os.close(event.root_fd)
        conn.send(answer)
        if answer[0] == "memory":
            return 3
