"""The budgeted executor: worker threads that turn a queued record into an ExecFailure.

Diagnosis and attribution read tenant file systems, so they run here, off the consume
loop, each call within a time budget (see execwatch.diagnosis.budget). Each diagnosis runs
in a worker process that is killed when it overruns its time or memory (see
execwatch.diagnosis.sandbox); attribution runs on the worker thread, watched by the
watchdog, which settles a record whose attribution overran and replaces the blocked thread.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from execwatch.diagnosis.budget import Attempt, SlowMounts
from execwatch.diagnosis.sandbox import STARVED_FACTOR, Diagnoser, DiagnosisPool, SandboxLimits
from execwatch.pipeline.dedup import Slot
from execwatch.pipeline.health import Heartbeat
from execwatch.pipeline.sink import Output
from execwatch.record import (
    Attribution,
    Diagnosis,
    ExecFailure,
    KernelEvent,
    UndiagnosedCause,
    undiagnosed,
)

log = logging.getLogger(__name__)

T = TypeVar("T")
DIAGNOSIS_BUDGET_S = 1.0  # a local diagnosis takes about a millisecond
Settle = Callable[[Slot, ExecFailure], None]


class Attributor(Protocol):
    def resolve(
        self, cgroup_id: int, pid: int | None = None, *, name: str = "", parent_id: int = 0
    ) -> Attribution: ...


@dataclass(frozen=True)
class ExecutorBudget:
    """How much work the executor may do at once, and for how long."""

    workers: int = 2  # threads, and diagnosis processes
    seconds: float = DIAGNOSIS_BUDGET_S  # per diagnosis, and per attribution
    queue_size: int = 1024
    max_stuck: int = 8  # threads left blocked in the kernel before no more are started
    limits: SandboxLimits = dataclasses.field(default_factory=SandboxLimits)


@dataclass(eq=False)
class _Worker:
    """One worker thread and what it is doing, for the watchdog (which watches attribution:
    the diagnosis pool kills its own overrunning processes)."""

    thread: threading.Thread = dataclasses.field(default_factory=threading.Thread)
    slot: Slot | None = None
    stage: str = ""  # "attribution" while a call runs
    started: float = 0.0
    attempt: Attempt | None = None
    diagnosis: Diagnosis | None = None  # done, while attribution runs
    abandoned: bool = False


@dataclass(frozen=True)
class _Overdue:
    """What a worker was doing when it overran, taken under the lock."""

    stage: str
    attempt: Attempt | None
    slot: Slot | None
    diagnosis: Diagnosis | None
    blocked: bool  # in the kernel (a FUSE or NFS wait), not running Python
    age: float


class BudgetedExecutor:
    """Owns its worker threads, the watchdog and the diagnosis worker processes; each
    record it builds is handed to `settle`. A failure of `settle` (the sink's: a closed
    pipe) is kept in `error` for the consume loop to raise."""

    def __init__(
        self,
        diagnoser: Diagnoser,
        attributor: Attributor | None,
        *,
        settle: Settle,
        decode: Callable[[bytes], KernelEvent],
        output: Output,
        budget: ExecutorBudget,
        slow: SlowMounts,
        heartbeat: Heartbeat,
    ) -> None:
        self._attributor = attributor
        self._settle_to = settle
        self._decode = decode
        self._output = output
        self._budget = budget
        self.slow = slow
        self._heartbeat = heartbeat
        self.error: BaseException | None = None
        self._queue: queue.Queue[Slot | None] = queue.Queue(budget.queue_size)
        self._lock = threading.Lock()  # the workers' state; never held while calling out
        self._workers: list[_Worker] = []
        self._stop = threading.Event()
        self._calls = threading.Event()  # set while a worker's call may need watching
        self._pool = DiagnosisPool(
            diagnoser,
            size=budget.workers,
            budget=budget.seconds,
            slow=slow,
            limits=budget.limits,
            max_stuck=budget.max_stuck,
        )
        heartbeat.watch(self._pool.problem)
        for _ in range(budget.workers):
            self._start_worker()
        self._watchdog = threading.Thread(target=self._watch, name="watchdog", daemon=True)
        self._watchdog.start()

    def submit(self, slot: Slot) -> bool:
        """Queue `slot` for its diagnosis; False when the queue is full."""
        try:
            self._queue.put_nowait(slot)
        except queue.Full:
            return False
        return True

    def queued(self) -> int:
        return self._queue.qsize()

    def live(self) -> int:
        """Diagnosis worker processes alive now (idle or busy)."""
        return self._pool.live()

    def close(self) -> None:
        """Stop the watchdog, then the workers, then the diagnosis processes."""
        self._stop.set()
        self._calls.set()
        self._watchdog.join(timeout=1.0)  # first: it may be starting a worker
        with self._lock:
            live = [w for w in self._workers if not w.abandoned]
        for _ in live:
            try:
                self._queue.put(None, timeout=1.0)
            except queue.Full:
                break
        for worker in live:
            worker.thread.join(timeout=1.0)
        self._heartbeat.unwatch(self._pool.problem)
        self._pool.close()

    def _start_worker(self) -> None:
        worker = _Worker()
        worker.thread = threading.Thread(
            target=self._work, args=(worker,), name="diagnosis", daemon=True
        )
        worker.thread.start()  # before it is listed: close() joins what it lists
        with self._lock:
            self._workers.append(worker)

    def _work(self, worker: _Worker) -> None:
        """Hands the event at once to an idle diagnosis process (a dying container's
        rootfs is there for only milliseconds), then attributes it here; the pool kills a
        diagnosis that overruns, the watchdog takes over an attribution that does."""
        while (slot := self._queue.get()) is not None:
            with self._lock:
                worker.slot, worker.diagnosis = slot, None
            try:
                failure = self._build(worker, self._decode(slot.latest))
            except Exception as exc:  # never lose a record, whatever broke
                log.exception("building a record failed")
                event = self._decode(slot.latest)
                failed = undiagnosed(UndiagnosedCause.FAILED, f"failed: {exc!r}")
                failure = ExecFailure(event, failed, Attribution())
            with self._lock:
                worker.slot = None
                if worker.abandoned:  # the watchdog settled this slot and replaced us
                    self._workers.remove(worker)
                    return
            if not self._settle(slot, failure):
                return

    def _settle(self, slot: Slot, failure: ExecFailure) -> bool:
        try:
            self._settle_to(slot, failure)
        except BaseException as exc:  # the sink's: raised again by the consume loop
            self.error = exc
            return False
        return True

    def _build(self, worker: _Worker, event: KernelEvent) -> ExecFailure:
        """A bug in diagnosis or attribution degrades the record; it never loses it."""
        outcome = self._pool.diagnose(event)
        if outcome.killed:
            self._output.overran(outcome.killed)
        diagnosis = outcome.diagnosis
        with self._lock:
            worker.diagnosis = diagnosis
        attributor = self._attributor
        try:
            attribution = (
                self._timed(
                    worker,
                    "attribution",
                    lambda: attributor.resolve(
                        event.cgroup_id,
                        event.tgid,
                        name=event.cgroup_name,
                        parent_id=event.cgroup_parent_id,
                    ),
                )
                if attributor
                else Attribution()
            )
        except Exception:
            log.exception("attribution failed", extra={"kv": {"cgroup_id": event.cgroup_id}})
            attribution = Attribution()
        return ExecFailure(event=event, diagnosis=diagnosis, attribution=attribution)

    def _timed(self, worker: _Worker, stage: str, call: Callable[[], T]) -> T:
        attempt = Attempt()
        with self._lock:
            worker.stage, worker.started, worker.attempt = stage, time.monotonic(), attempt
            self._calls.set()
        self.slow.attach(attempt)
        try:
            return call()
        finally:
            self.slow.attach(None)
            with self._lock:
                worker.stage = ""

    def _watch(self) -> None:
        """Settles a record whose attribution overran its budget blocked in the kernel
        (a read on a hung mount cannot be interrupted), with its diagnosis, and starts a
        fresh worker thread in place of the blocked one. A call that is merely slow,
        running Python on a starved CPU, is left to finish up to STARVED_FACTOR budgets."""
        budget = self._budget.seconds
        period = min(0.1, budget / 4)
        while self._calls.wait() and not self._stop.wait(period):  # asleep while none runs
            now = time.monotonic()
            overdue: list[_Overdue] = []
            with self._lock:
                if not any(w.stage and not w.abandoned for w in self._workers):
                    self._calls.clear()
                for w in self._workers:
                    age = now - w.started
                    if not w.stage or w.abandoned or age <= budget:
                        continue
                    blocked = w.attempt is not None and self.slow.held_by_kernel(w.attempt.tid)
                    if blocked or age > budget * STARVED_FACTOR:
                        w.abandoned = True
                        overdue.append(
                            _Overdue(w.stage, w.attempt, w.slot, w.diagnosis, blocked, age)
                        )
                stuck = sum(w.abandoned for w in self._workers)
            for late in overdue:
                self._overran(late)
                if stuck <= self._budget.max_stuck:
                    self._start_worker()

    def _overran(self, late: _Overdue) -> None:
        stage, attempt, slot = late.stage, late.attempt, late.slot
        if slot is None or attempt is None:
            return
        self._output.overran(stage)
        mount = attempt.mount if late.blocked else None
        if late.blocked:
            where = f" in {mount}" if mount else ""
            cause = f"{stage} overran its {self._budget.seconds:g} s budget{where}"
        else:
            cause = f"{stage} still running after {late.age:.1f} s (a starved CPU?)"
        log.warning("budget overran", extra={"kv": {"cause": cause}})
        if mount is not None:
            self.slow.mark(mount)
            cause += "; later events there are not waited for"
        diagnosis = late.diagnosis if stage == "attribution" else None
        event = self._decode(slot.latest)
        diagnosis = diagnosis or undiagnosed(UndiagnosedCause.OVERRAN, cause)
        self._settle(slot, ExecFailure(event, diagnosis))
