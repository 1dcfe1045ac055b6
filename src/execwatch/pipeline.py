"""The node pipeline: ring-buffer record -> KernelEvent -> diagnosis -> attribution -> record.

Shared by `execwatch trace` and the cluster agent. The consume loop (the ring-buffer
thread) only counts, folds and queues: diagnosis and attribution read tenant file
systems, so they run on worker threads, each call within a time budget (see
execwatch.diagnosis.budget). Each diagnosis runs in a worker process that is killed when
it overruns its time or memory (see execwatch.diagnosis.sandbox); attribution and the
folding stay in this process. A burst of identical failures (one container retrying one
binary) is diagnosed once and folded: the first occurrence is emitted when diagnosed,
the repeats as one record with their exact count per window. Repeats are recognised on
the raw record, before decoding, so a failure storm stays cheap. The kernel folds a PATH
search's repeated misses itself (see ew_fold_slot): their counts are credited, once per
window, to the slot of the record each followed.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from execwatch.diagnosis.budget import Attempt, SlowMounts
from execwatch.diagnosis.sandbox import STARVED_FACTOR, DiagnosisPool, SandboxLimits
from execwatch.probe import layout
from execwatch.probe.events import decode_record as decode
from execwatch.probe.events import repeat_key
from execwatch.record import QUIET_REASONS, Attribution, Diagnosis, ExecFailure, KernelEvent, Reason

log = logging.getLogger(__name__)

T = TypeVar("T")
Sink = Callable[[ExecFailure], None]
# Records submitted without a wakeup (see wakeup_flag in the BPF C) come at most 10 ms
# after one that woke the consumer: for BUSY_S after it consumed anything, it polls with
# this timeout, so they wait at most this long. Idle, it wakes only every IDLE_POLL_MS
# (and for each window's flush): an idle agent's cost is its wakeups.
POLL_TIMEOUT_MS = 50
IDLE_POLL_MS = 500
BUSY_S = 0.2
AggregationKey = tuple[int, int, int, int, bytes, bytes]
DIAGNOSIS_BUDGET_S = 1.0  # a local diagnosis takes about a millisecond
STALL_AFTER_S = 20.0
HealthCheck = Callable[[], "str | None"]


class Diagnoser(Protocol):
    def diagnose(self, event: KernelEvent) -> Diagnosis: ...


class Attributor(Protocol):
    def resolve(
        self, cgroup_id: int, pid: int | None = None, *, name: str = "", parent_id: int = 0
    ) -> Attribution: ...


class RecordSource(Protocol):
    """The probe, as the pipeline sees it: poll() hands records to on_record."""

    def poll(self, timeout_ms: int) -> int: ...


class PipelineObserver(Protocol):
    """What the pipeline reports about itself (metrics); see execwatch.metrics."""

    def delivered(
        self, errno: int | str, reason: Reason, *, aggregated: bool, count: int = 1
    ) -> None:
        """errno: the number, or a name (EXIT127, SIGSEGV for an early death)."""

    def dropped(self, kind: str, count: int = 1) -> None: ...

    def overran(self, stage: str) -> None: ...


class KernelFolds(Protocol):
    def take_folds(self) -> dict[layout.FoldedName, int]: ...


class PrunableCounts(Protocol):
    def forget_counts(self, keep: Callable[[int], bool]) -> int: ...


class CountsPruner:
    """Every `interval` seconds, drops the kernel's per-cgroup counts of removed cgroups,
    so that the 16,384-entry map never fills with the dead and `counter_map_full` counts
    only failures that really could not be counted per cgroup. Off the consume loop."""

    def __init__(
        self, probe: PrunableCounts, alive: Callable[[int], bool], interval: float = 30.0
    ) -> None:
        self._probe = probe
        self._alive = alive
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="counts-pruner", daemon=True)

    def __enter__(self) -> CountsPruner:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                removed = self._probe.forget_counts(self._alive)
            except Exception:  # a failed sweep is retried next time; never kill the agent
                log.exception("pruning the kernel counts failed")
                continue
            if removed:
                log.debug("kernel counts of removed cgroups dropped", extra={"kv": {"n": removed}})


class Heartbeat:
    """When the consume loop last went round, and the checks of what it depends on.
    Liveness fails when the loop stalls or diagnosis capacity is gone (no worker process
    alive and none can be started); a merely slow diagnosis never makes the agent look dead."""

    def __init__(self, stall_after: float = STALL_AFTER_S) -> None:
        self.stall_after = stall_after
        self._last = time.monotonic()
        self._checks: list[HealthCheck] = []

    def watch(self, check: HealthCheck) -> None:
        self._checks.append(check)

    def unwatch(self, check: HealthCheck) -> None:
        if check in self._checks:
            self._checks.remove(check)

    def beat(self, now: float | None = None) -> None:
        self._last = time.monotonic() if now is None else now

    def age(self) -> float:
        return time.monotonic() - self._last

    def problem(self) -> str | None:
        """None when healthy, else why not (for the /healthz answer)."""
        age = self.age()
        if age > self.stall_after:
            return f"the ring-buffer consume loop has not run for {age:.1f} s"
        return next((p for check in list(self._checks) if (p := check()) is not None), None)


@dataclass(eq=False)
class _Worker:
    """One worker thread and what it is doing, for the watchdog (which watches attribution:
    the diagnosis pool kills its own overrunning processes)."""

    thread: threading.Thread = dataclasses.field(default_factory=threading.Thread)
    slot: _Slot | None = None
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
    slot: _Slot | None
    diagnosis: Diagnosis | None
    blocked: bool  # in the kernel (a FUSE or NFS wait), not running Python
    age: float


@dataclass
class _Slot:
    key: AggregationKey
    failure: ExecFailure | None  # the diagnosed first occurrence; None while diagnosing
    latest: bytes  # raw record of the newest repeat
    pending: int  # repeats not emitted yet
    last_seen: float
    unreported: int = 0  # repeats that arrived before the diagnosis: counted once it is known
    closed: bool = False  # emitted without waiting for its diagnosis (shutdown)


def aggregation_key(raw: bytes) -> AggregationKey:
    """The record's repeat key, by its kind (probe.events.KINDS), straight from its bytes:
    for a failed exec (cgroup, mntns, root, errno, filename, fd name), for an early death
    (cgroup, mntns, root, -signal or -256 - exit code, exe device, exe inode)."""
    return repeat_key(raw)


def _undiagnosed(detail: str) -> Diagnosis:
    return Diagnosis(Reason.UNDIAGNOSED, "", detail=detail)


class NodePipeline:
    """Use as a context manager (or call close()): it owns its worker threads and the
    diagnosis worker processes (`workers` of each; `limits` bounds each process)."""

    def __init__(
        self,
        diagnoser: Diagnoser,
        sink: Sink,
        *,
        epoch_offset: float,
        attributor: Attributor | None = None,
        observer: PipelineObserver | None = None,
        show_not_found: bool = False,
        show_crashes: bool = False,
        window: float = 1.0,
        max_slots: int = 8192,
        budget: float = DIAGNOSIS_BUDGET_S,
        slow: SlowMounts | None = None,
        workers: int = 2,
        queue_size: int = 1024,
        heartbeat: Heartbeat | None = None,
        max_stuck: int = 8,
        folds: KernelFolds | None = None,
        limits: SandboxLimits | None = None,
    ) -> None:
        self._sink = sink
        self._epoch_offset = epoch_offset
        self._attributor = attributor
        self._observer = observer
        self._show = {Reason.NOT_FOUND: show_not_found, Reason.STARTUP_CRASH: show_crashes}
        self._window = window
        self._max_slots = max_slots
        self.slow = slow if slow is not None else SlowMounts()
        self._budget = budget
        self._max_stuck = max_stuck
        self._folds = folds
        self.heartbeat = heartbeat if heartbeat is not None else Heartbeat()
        self._slots: OrderedDict[AggregationKey, _Slot] = OrderedDict()
        self._lock = threading.Lock()  # slots and workers; never held while calling out
        self._sink_lock = threading.Lock()  # one record at a time into the sink
        self._queue: queue.Queue[_Slot | None] = queue.Queue(queue_size)
        self._idle = threading.Condition(self._lock)
        self._unsettled = 0
        self._error: BaseException | None = None  # a worker's sink failed (a closed pipe)
        self._workers: list[_Worker] = []
        self._stop = threading.Event()
        self._calls = threading.Event()  # set while a worker's call may need watching
        self._pool = DiagnosisPool(
            diagnoser,
            size=workers,
            budget=budget,
            slow=self.slow,
            limits=limits or SandboxLimits(),
            max_stuck=max_stuck,
        )
        self.heartbeat.watch(self._pool.problem)
        for _ in range(workers):
            self._start_worker()
        self._watchdog = threading.Thread(target=self._watch, name="watchdog", daemon=True)
        self._watchdog.start()

    def __enter__(self) -> NodePipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def on_record(self, raw: bytes) -> None:
        """The consume loop's whole job per record: fold it, or queue it for diagnosis."""
        key = aggregation_key(raw)
        now = time.monotonic()
        self.heartbeat.beat(now)
        with self._lock:
            slot = self._slots.get(key)
            fresh = slot is not None and now - slot.last_seen < self._window * 10
            if slot is not None and fresh:
                slot.pending += 1
                slot.latest = raw
                slot.last_seen = now
                known = slot.failure
                slot.unreported += known is None
            else:
                stale = [self._slots.pop(key)] if slot is not None else []
                slot = _Slot(key, None, raw, 0, now)
                self._slots[key] = slot
                while len(self._slots) > self._max_slots:
                    stale.append(self._slots.popitem(last=False)[1])
                self._unsettled += 1
        if fresh:
            if known is not None:
                self._report(known, aggregated=True, count=1)
            return
        for old in stale:  # diagnosed afresh, keeping their counts
            self._emit_pending(old)
        try:
            self._queue.put_nowait(slot)
        except queue.Full:
            self._report_drop("diagnosis_queue_full")
            event = decode(raw, self._epoch_offset)
            detail = "not diagnosed: the diagnosis queue was full"
            self._settle(slot, ExecFailure(event, _undiagnosed(detail), Attribution()))

    def run(
        self, source: RecordSource, stop: threading.Event, deadline: float | None = None
    ) -> None:
        """Consume until `stop` is set (or the monotonic `deadline` passes), flushing folded
        repeats once per window; then drain what the kernel still holds and flush it all."""
        next_flush = time.monotonic() + self._window
        busy_until = 0.0
        try:
            while not stop.is_set() and (deadline is None or time.monotonic() < deadline):
                self.heartbeat.beat()
                if self._error is not None:
                    raise self._error
                now = time.monotonic()
                timeout = POLL_TIMEOUT_MS
                if now >= busy_until:
                    timeout = max(0, min(IDLE_POLL_MS, int((next_flush - now) * 1000) + 1))
                if source.poll(timeout):
                    busy_until = time.monotonic() + BUSY_S
                if time.monotonic() >= next_flush:
                    self.flush()
                    next_flush = time.monotonic() + self._window
            source.poll(0)
        finally:
            self.close()

    def diagnosis_capacity(self) -> int:
        """Diagnosis worker processes alive now (idle or busy)."""
        return self._pool.live()

    def drain(self, timeout: float) -> bool:
        """Wait until every queued record is diagnosed and emitted; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._unsettled:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._idle.wait(remaining)
        return True

    def close(self) -> None:
        """Drain (within two budgets per queued record), stop the workers, flush all."""
        if self._error is None:
            self.drain(2 * self._budget * max(1, self._queue.qsize()) + 1.0)
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
        self.heartbeat.unwatch(self._pool.problem)
        self._pool.close()
        self.flush(final=True)

    def flush(self, *, final: bool = False) -> None:
        """Emit folded repeats; forget slots idle for ten windows (or all, when final)."""
        if self._folds is not None:
            self._absorb(self._folds.take_folds())
        now = time.monotonic()
        with self._lock:
            slots = list(self._slots.items())
        for key, slot in slots:
            if final and slot.failure is None:
                self._close_unsettled(slot)
            self._emit_pending(slot)
            if final or now - slot.last_seen >= self._window * 10:
                with self._lock:
                    if self._slots.get(key) is slot:
                        del self._slots[key]

    def _absorb(self, folded: dict[layout.FoldedName, int]) -> None:
        """Credit the kernel's folded repeats to the slot of the record each followed."""
        now = time.monotonic()
        for (cgroup, mntns, root, err, name), n in folded.items():
            with self._lock:
                slot = self._slots.get((cgroup, mntns, root, err, name, b""))
                known = slot.failure if slot is not None else None
                if slot is not None:
                    slot.pending += n
                    slot.last_seen = now
                    slot.unreported += n if known is None else 0
            if known is not None:
                self._report(known, aggregated=True, count=n)
            elif slot is None and self._observer:  # its slot was evicted (max_slots)
                status = errno.errorcode.get(err, str(err))
                self._observer.delivered(status, Reason.UNDIAGNOSED, aggregated=True, count=n)

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
                failure = self._build(worker, decode(slot.latest, self._epoch_offset))
            except Exception as exc:  # never lose a record, whatever broke
                log.exception("building a record failed")
                event = decode(slot.latest, self._epoch_offset)
                failure = ExecFailure(event, _undiagnosed(f"failed: {exc!r}"), Attribution())
            with self._lock:
                worker.slot = None
                if worker.abandoned:  # the watchdog settled this slot and replaced us
                    self._workers.remove(worker)
                    return
            try:
                self._settle(slot, failure)
            except BaseException as exc:  # the sink's: raised again by the consume loop
                self._error = exc
                return

    def _build(self, worker: _Worker, event: KernelEvent) -> ExecFailure:
        """A bug in diagnosis or attribution degrades the record; it never loses it."""
        outcome = self._pool.diagnose(event)
        if outcome.killed and self._observer:
            self._observer.overran(outcome.killed)
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
        period = min(0.1, self._budget / 4)
        while self._calls.wait() and not self._stop.wait(period):  # asleep while none runs
            now = time.monotonic()
            overdue: list[_Overdue] = []
            with self._lock:
                if not any(w.stage and not w.abandoned for w in self._workers):
                    self._calls.clear()
                for w in self._workers:
                    age = now - w.started
                    if not w.stage or w.abandoned or age <= self._budget:
                        continue
                    blocked = w.attempt is not None and self.slow.held_by_kernel(w.attempt.tid)
                    if blocked or age > self._budget * STARVED_FACTOR:
                        w.abandoned = True
                        overdue.append(
                            _Overdue(w.stage, w.attempt, w.slot, w.diagnosis, blocked, age)
                        )
                stuck = sum(w.abandoned for w in self._workers)
            for late in overdue:
                self._overran(late)
                if stuck <= self._max_stuck:
                    self._start_worker()

    def _overran(self, late: _Overdue) -> None:
        stage, attempt, slot = late.stage, late.attempt, late.slot
        if slot is None or attempt is None:
            return
        if self._observer:
            self._observer.overran(stage)
        mount = attempt.mount if late.blocked else None
        if late.blocked:
            where = f" in {mount}" if mount else ""
            cause = f"{stage} overran its {self._budget:g} s budget{where}"
        else:
            cause = f"{stage} still running after {late.age:.1f} s (a starved CPU?)"
        log.warning("budget overran", extra={"kv": {"cause": cause}})
        if mount is not None:
            self.slow.mark(mount)
            cause += "; later events there are not waited for"
        diagnosis = late.diagnosis if stage == "attribution" else None
        event = decode(slot.latest, self._epoch_offset)
        try:
            self._settle(slot, ExecFailure(event, diagnosis or _undiagnosed(cause)))
        except BaseException as exc:  # the sink's: raised again by the consume loop
            self._error = exc

    def _settle(self, slot: _Slot, failure: ExecFailure) -> None:
        with self._lock:
            if slot.failure is not None or slot.closed:
                return
            slot.failure = failure
            unreported, slot.unreported = slot.unreported, 0
        self._report(failure, aggregated=False, count=1)
        if unreported:
            self._report(failure, aggregated=True, count=unreported)
        self._emit(failure)
        with self._lock:
            orphan = self._slots.get(slot.key) is not slot
        if orphan:  # evicted while being diagnosed: its repeats are not flushed by anyone else
            self._emit_pending(slot)
        with self._idle:
            self._unsettled -= 1
            self._idle.notify_all()

    def _close_unsettled(self, slot: _Slot) -> None:
        with self._lock:
            if slot.failure is not None or slot.closed:
                return
            slot.closed = True
            self._unsettled -= 1
            self._idle.notify_all()
        event = decode(slot.latest, self._epoch_offset)
        failure = ExecFailure(
            event, _undiagnosed("not diagnosed: stopping"), Attribution(), count=1 + slot.pending
        )
        slot.pending = 0
        self._report(failure, aggregated=False, count=1)
        if failure.count > 1:
            self._report(failure, aggregated=True, count=failure.count - 1)
        self._emit(failure)

    def _report(self, failure: ExecFailure, *, aggregated: bool, count: int) -> None:
        if self._observer:
            self._observer.delivered(
                failure.event.status, failure.diagnosis.reason, aggregated=aggregated, count=count
            )

    def _report_drop(self, kind: str) -> None:
        if self._observer:
            self._observer.dropped(kind)

    def _emit_pending(self, slot: _Slot) -> None:
        with self._lock:
            if slot.failure is None or not slot.pending:
                return
            first, latest, count = slot.failure, slot.latest, slot.pending
            slot.pending = 0
        self._emit(
            dataclasses.replace(first, event=decode(latest, self._epoch_offset), count=count)
        )

    def _emit(self, failure: ExecFailure) -> None:
        reason = failure.diagnosis.reason
        if reason in QUIET_REASONS and not self._show.get(reason, False):
            return  # counted by _report, not printed nor published
        with self._sink_lock:
            self._sink(failure)
