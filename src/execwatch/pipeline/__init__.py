"""The node pipeline: ring-buffer record -> KernelEvent -> diagnosis -> attribution -> record.

Three parts, one per module. The consume loop (the ring-buffer thread) only counts, folds
and queues (`dedup`: a burst of identical failures, one container retrying one binary, is
diagnosed once: the first occurrence is emitted when diagnosed, the repeats as one record
with their exact count per window). The budgeted executor (`executor`: worker threads,
diagnosis worker processes and a watchdog) turns each queued record into an ExecFailure.
The output (`sink`) counts every failure and passes those worth showing to the sink.
The kernel folds a PATH search's repeated misses itself (see ew_fold_slot): their counts
are credited, once per window, to the slot of the record each followed. A file with no
`#!` is held, diagnosed, until its caller's fate is known (`fates`): the kernel's word on
how the caller exited, or the death window's end.

`execwatch.node.stack.NodeStack` assembles the pipeline with the probe; use that.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass
from typing import Protocol

from execwatch.diagnosis.budget import SlowMounts
from execwatch.diagnosis.sandbox import Diagnoser
from execwatch.pipeline.dedup import Repeats, Slot
from execwatch.pipeline.executor import (
    DIAGNOSIS_BUDGET_S,
    Attributor,
    BudgetedExecutor,
    ExecutorBudget,
)
from execwatch.pipeline.fates import Fates, awaits_fate
from execwatch.pipeline.health import CountsPruner, Heartbeat
from execwatch.pipeline.sink import Output, PipelineObserver, Sink
from execwatch.probe import layout
from execwatch.probe.events import DEATH_WINDOW_S, decode_enoexec_exit, decode_record, repeat_key
from execwatch.record import (
    Attribution,
    ExecFailure,
    KernelEvent,
    Kind,
    RepeatKey,
    UndiagnosedCause,
    undiagnosed,
)

__all__ = [
    "DIAGNOSIS_BUDGET_S",
    "Attributor",
    "CountsPruner",
    "Diagnoser",
    "ExecutorBudget",
    "Heartbeat",
    "KernelFolds",
    "NodePipeline",
    "PipelineObserver",
    "PipelineOptions",
    "RecordSource",
    "Sink",
    "repeat_key",
]

# Records submitted without a wakeup (see wakeup_flag in the BPF C) come at most 10 ms
# after one that woke the consumer: for BUSY_S after it consumed anything, it polls with
# this timeout, so they wait at most this long. Idle, it wakes only every IDLE_POLL_MS
# (and for each window's flush): an idle agent's cost is its wakeups.
POLL_TIMEOUT_MS = 50
IDLE_POLL_MS = 500
BUSY_S = 0.2
_ENOEXEC_EXIT = Kind.ENOEXEC_EXIT.value  # decided by the pipeline itself (fates.py)


class RecordSource(Protocol):
    """The probe, as the pipeline sees it: poll() hands records to on_record."""

    def poll(self, timeout_ms: int) -> int: ...


class KernelFolds(Protocol):
    def take_folds(self) -> dict[layout.FoldedName, int]: ...


@dataclass(frozen=True)
class PipelineOptions:
    """What `execwatch trace` and the agent choose about the pipeline."""

    window: float = 1.0  # repeats within it are one record with a count (0: none are)
    max_slots: int = 8192  # repeat keys remembered
    # A key's diagnosis is reused for at most this long, however often it repeats: a file
    # changed under a loop that keeps failing is diagnosed again.
    rediagnose_after: float = 60.0
    show_not_found: bool = False
    show_crashes: bool = False
    show_no_shebang: bool = False  # a file with no #! that its caller went on from
    budget: ExecutorBudget = dataclasses.field(default_factory=ExecutorBudget)


class NodePipeline:
    """Use as a context manager (or call close()): it owns the executor's worker threads
    and diagnosis worker processes (`options.budget.limits` bounds each process)."""

    def __init__(
        self,
        diagnoser: Diagnoser,
        sink: Sink,
        options: PipelineOptions | None = None,
        *,
        epoch_offset: float,
        attributor: Attributor | None = None,
        observer: PipelineObserver | None = None,
        slow: SlowMounts | None = None,
        heartbeat: Heartbeat | None = None,
        folds: KernelFolds | None = None,
        death_window: float = DEATH_WINDOW_S,
    ) -> None:
        """`death_window`: the probe's (seconds), how long a file with no #! waits for its
        caller's fate; not an option of the pipeline's own."""
        options = options or PipelineOptions()
        self._epoch_offset = epoch_offset
        self._window = options.window
        self._budget = options.budget.seconds
        self._folds = folds
        self.heartbeat = heartbeat if heartbeat is not None else Heartbeat()
        self._repeats = Repeats(options.window, options.max_slots, options.rediagnose_after)
        self._output = Output(
            sink,
            observer,
            show_not_found=options.show_not_found,
            show_crashes=options.show_crashes,
            show_no_shebang=options.show_no_shebang,
        )
        self._executor = BudgetedExecutor(
            diagnoser,
            attributor,
            settle=self._settle,
            decode=self._decode,
            output=self._output,
            budget=options.budget,
            slow=slow if slow is not None else SlowMounts(),
            heartbeat=self.heartbeat,
        )
        self.slow = self._executor.slow
        self._fates: Fates[Slot] = Fates(death_window, dropped=self._output.dropped)
        self._closed = False

    def __enter__(self) -> NodePipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def on_record(self, raw: bytes) -> None:
        """The consume loop's whole job per record: fold it, or queue it for diagnosis."""
        now = time.monotonic()
        if layout.KIND.unpack_from(raw)[0] == _ENOEXEC_EXIT:
            self.heartbeat.beat(now)
            self._release(self._fates.exited(decode_enoexec_exit(raw, self._epoch_offset), now))
            return
        key = repeat_key(raw)
        self.heartbeat.beat(now)
        folded, known = self._repeats.repeat(key, raw, now)
        if folded:
            if known is not None:
                self._output.counted(known, aggregated=True, count=1)
            return
        slot, evicted = self._repeats.open(key, raw, now)
        for old in evicted:  # diagnosed afresh, keeping their counts
            self._emit_pending(old)
        if not self._executor.submit(slot):
            self._output.dropped("diagnosis_queue_full")
            detail = "not diagnosed: the diagnosis queue was full"
            event = self._decode(raw)
            diagnosis = undiagnosed(UndiagnosedCause.OVERLOADED, detail)
            self._settle(slot, ExecFailure(event, diagnosis, Attribution()))

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
                if self._executor.error is not None:
                    raise self._executor.error
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
        return self._executor.live()

    def drain(self, timeout: float) -> bool:
        """Wait until every queued record is diagnosed and emitted; False on timeout."""
        return self._repeats.wait_settled(timeout)

    def close(self) -> None:
        """Drain (within two budgets per queued record), stop the workers, flush all.
        Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._executor.error is None:
            self.drain(2 * self._budget * max(1, self._executor.queued()) + 1.0)
        self._executor.close()
        self.flush(final=True)

    def flush(self, *, final: bool = False) -> None:
        """Emit folded repeats; forget slots idle for ten windows (or all, when final)."""
        if self._folds is not None:
            self._absorb(self._folds.take_folds())
        now = time.monotonic()
        self._release(self._fates.expire(now, final=final))
        for slot in self._repeats.slots():
            if final and slot.failure is None:
                self._close_unsettled(slot)
            self._emit_pending(slot)
            self._repeats.forget_idle(slot, now, final=final)

    def _absorb(self, folded: dict[layout.FoldedName, int]) -> None:
        """Credit the kernel's folded repeats to the slot of the record each followed."""
        for name, n in folded.items():
            key = RepeatKey.of_fold(*name)
            found, known = self._repeats.absorb(key, n)
            if known is not None:
                self._output.counted(known, aggregated=True, count=n)
            elif not found:  # its slot was evicted (max_slots)
                self._output.counted_unknown(key, n)

    def _decode(self, raw: bytes) -> KernelEvent:
        return decode_record(raw, self._epoch_offset)

    def _settle(self, slot: Slot, failure: ExecFailure) -> None:
        if awaits_fate(failure) and self._repeats.hold(slot):
            ready = self._fates.hold(slot, failure, time.monotonic())
            self._repeats.settled()  # diagnosed: nothing left for the executor
            self._release(ready)
            return
        unreported = self._repeats.settle(slot, failure)
        if unreported is None:
            return
        self._emit_first(slot, failure, unreported)
        self._repeats.settled()

    def _release(self, verdicts: list[tuple[Slot, ExecFailure]]) -> None:
        """Held failures whose caller's fate is known (or no longer waited for)."""
        for slot, failure in verdicts:
            unreported = self._repeats.release(slot, failure)
            if unreported is not None:
                self._emit_first(slot, failure, unreported)

    def _emit_first(self, slot: Slot, failure: ExecFailure, unreported: int) -> None:
        self._output.counted(failure, aggregated=False, count=1)
        if unreported:
            self._output.counted(failure, aggregated=True, count=unreported)
        self._output.emit(failure)
        if self._repeats.evicted(slot):  # its repeats are not flushed by anyone else
            self._emit_pending(slot)

    def _close_unsettled(self, slot: Slot) -> None:
        pending = self._repeats.close(slot)
        if pending is None:
            return
        failure = ExecFailure(
            self._decode(slot.latest),
            undiagnosed(UndiagnosedCause.STOPPING, "not diagnosed: stopping"),
            Attribution(),
            count=1 + pending,
        )
        self._output.counted(failure, aggregated=False, count=1)
        if pending:
            self._output.counted(failure, aggregated=True, count=pending)
        self._output.emit(failure)

    def _emit_pending(self, slot: Slot) -> None:
        taken = self._repeats.take_pending(slot)
        if taken is None:
            return
        first, latest, count = taken
        self._output.emit(dataclasses.replace(first, event=self._decode(latest), count=count))
