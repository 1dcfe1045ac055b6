"""The node pipeline: ring-buffer record -> KernelEvent -> diagnosis -> attribution -> record.

Shared by `execwatch trace` and the cluster agent. A burst of identical failures (one
container retrying one binary) is diagnosed once and folded: the first occurrence is
emitted at once, the repeats as one record with their exact count per window. Repeats
are recognised on the raw record, before decoding, so a failure storm stays cheap.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from execwatch.probe import layout
from execwatch.probe.events import decode_record as decode
from execwatch.record import QUIET_REASONS, Attribution, Diagnosis, ExecFailure, KernelEvent, Reason

log = logging.getLogger(__name__)

Sink = Callable[[ExecFailure], None]
# Records submitted without a wakeup wait at most this long (see wakeup_flag in the BPF C).
POLL_TIMEOUT_MS = 50
AggregationKey = tuple[int, int, int, bytes, bytes]


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

    def delivered(self, errno: int | str, reason: Reason, *, aggregated: bool) -> None:
        """errno: the number, or a name (EXIT127, SIGSEGV for an early death)."""


@dataclass
class _Slot:
    failure: ExecFailure  # the diagnosed first occurrence
    latest: bytes  # raw record of the newest repeat
    pending: int  # repeats not emitted yet
    last_seen: float


def aggregation_key(raw: bytes) -> AggregationKey:
    """(cgroup, mntns, errno, filename, fd name) straight from the record's bytes.

    Strings are cut at their NUL: the ring buffer does not zero what follows it. An early
    death's key is (cgroup, mntns, -signal or -256 - exit code, exe device, exe inode)."""
    if len(raw) == layout.DEATH_STRUCT.size:
        return death_key(raw)
    f, order = layout.EVENT_FIELDS, sys.byteorder
    return (
        int.from_bytes(raw[f.cgroup], order),
        int.from_bytes(raw[f.mntns], order),
        int.from_bytes(raw[f.err], order),
        raw[f.filename].split(b"\0", 1)[0],
        raw[f.fd_name].split(b"\0", 1)[0],
    )


def death_key(raw: bytes) -> AggregationKey:
    d, order = layout.DEATH_FIELDS, sys.byteorder
    sig = int.from_bytes(raw[d.signal], order, signed=True)
    code = int.from_bytes(raw[d.exit_code], order, signed=True)
    return (
        int.from_bytes(raw[d.cgroup], order),
        int.from_bytes(raw[d.mntns], order),
        -sig if sig else -256 - code,
        raw[d.exe_dev],
        raw[d.exe_ino],
    )


class NodePipeline:
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
    ) -> None:
        self._diagnoser = diagnoser
        self._sink = sink
        self._epoch_offset = epoch_offset
        self._attributor = attributor
        self._observer = observer
        self._show = {Reason.NOT_FOUND: show_not_found, Reason.STARTUP_CRASH: show_crashes}
        self._window = window
        self._max_slots = max_slots
        self._slots: OrderedDict[AggregationKey, _Slot] = OrderedDict()

    def on_record(self, raw: bytes) -> None:
        key = aggregation_key(raw)
        now = time.monotonic()
        slot = self._slots.get(key)
        if slot is not None and now - slot.last_seen < self._window * 10:
            slot.pending += 1
            slot.latest = raw
            slot.last_seen = now
            self._report(slot.failure.event.status, slot.failure.diagnosis.reason, aggregated=True)
            return
        if slot is not None:
            self._emit_pending(slot)  # stale slot: diagnose afresh, keep its count
        failure = self._build(decode(raw, self._epoch_offset))
        self._report(failure.event.status, failure.diagnosis.reason, aggregated=False)
        self._slots[key] = _Slot(failure, raw, 0, now)
        self._slots.move_to_end(key)
        while len(self._slots) > self._max_slots:
            self._emit_pending(self._slots.popitem(last=False)[1])
        self._emit(failure)

    def run(
        self, source: RecordSource, stop: threading.Event, deadline: float | None = None
    ) -> None:
        """Consume until `stop` is set (or the monotonic `deadline` passes), flushing folded
        repeats once per window; then drain what the kernel still holds and flush it all."""
        next_flush = time.monotonic() + self._window
        try:
            while not stop.is_set() and (deadline is None or time.monotonic() < deadline):
                source.poll(POLL_TIMEOUT_MS)
                if time.monotonic() >= next_flush:
                    self.flush()
                    next_flush = time.monotonic() + self._window
            source.poll(0)
        finally:
            self.flush(final=True)

    def flush(self, *, final: bool = False) -> None:
        """Emit folded repeats; forget slots idle for ten windows (or all, when final)."""
        now = time.monotonic()
        for key, slot in list(self._slots.items()):
            self._emit_pending(slot)
            if final or now - slot.last_seen >= self._window * 10:
                del self._slots[key]

    def _build(self, event: KernelEvent) -> ExecFailure:
        """A bug in diagnosis or attribution degrades the record; it never loses it."""
        try:
            diagnosis = self._diagnoser.diagnose(event)
        except Exception as exc:
            log.exception("diagnosis failed", extra={"kv": {"path": event.path}})
            diagnosis = Diagnosis(Reason.UNDIAGNOSED, "", detail=f"diagnosis failed: {exc!r}")
        try:
            attribution = (
                self._attributor.resolve(
                    event.cgroup_id,
                    event.tgid,
                    name=event.cgroup_name,
                    parent_id=event.cgroup_parent_id,
                )
                if self._attributor
                else Attribution()
            )
        except Exception:
            log.exception("attribution failed", extra={"kv": {"cgroup_id": event.cgroup_id}})
            attribution = Attribution()
        return ExecFailure(event=event, diagnosis=diagnosis, attribution=attribution)

    def _report(self, errno: int | str, reason: Reason, *, aggregated: bool) -> None:
        if self._observer:
            self._observer.delivered(errno, reason, aggregated=aggregated)

    def _emit_pending(self, slot: _Slot) -> None:
        if slot.pending:
            latest = decode(slot.latest, self._epoch_offset)
            self._emit(dataclasses.replace(slot.failure, event=latest, count=slot.pending))
            slot.pending = 0

    def _emit(self, failure: ExecFailure) -> None:
        reason = failure.diagnosis.reason
        if reason in QUIET_REASONS and not self._show.get(reason, False):
            return  # counted by _report, not printed nor published
        self._sink(failure)
