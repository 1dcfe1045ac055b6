"""The pipeline's way out: every failure is counted by the observer, and those worth
showing go to the sink, one record at a time."""

from __future__ import annotations

import errno
import threading
from collections.abc import Callable
from typing import Protocol

from execwatch.record import QUIET_REASONS, ExecFailure, Kind, Reason, RepeatKey, UndiagnosedCause

Sink = Callable[[ExecFailure], None]


class PipelineObserver(Protocol):
    """What the pipeline reports about itself (metrics); see execwatch.node.metrics."""

    def delivered(
        self,
        errno: int | str,
        reason: Reason,
        *,
        aggregated: bool,
        count: int = 1,
        cause: UndiagnosedCause | None = None,
    ) -> None:
        """errno: the number, or a name (EXIT127, SIGSEGV for an early death); cause: why
        an Undiagnosed one is."""

    def dropped(self, kind: str, count: int = 1) -> None: ...

    def overran(self, stage: str) -> None: ...


class Output:
    """The sink and the observer. Quiet reasons (NotFound, StartupCrash, NoShebang) are
    counted, and printed or published only when asked for."""

    def __init__(
        self,
        sink: Sink,
        observer: PipelineObserver | None,
        *,
        show_not_found: bool = False,
        show_crashes: bool = False,
        show_no_shebang: bool = False,
    ) -> None:
        self._sink = sink
        self._observer = observer
        self._show = {
            Reason.NOT_FOUND: show_not_found,
            Reason.STARTUP_CRASH: show_crashes,
            Reason.NO_SHEBANG: show_no_shebang,
        }
        self._lock = threading.Lock()  # one record at a time into the sink

    def counted(self, failure: ExecFailure, *, aggregated: bool, count: int) -> None:
        if self._observer:
            d = failure.diagnosis
            self._observer.delivered(
                failure.event.status, d.reason, aggregated=aggregated, count=count, cause=d.cause
            )

    def counted_unknown(self, key: RepeatKey, count: int) -> None:
        """Repeats the kernel folded for a record whose slot is gone (evicted): failed
        execs left undiagnosed, emulated execs still emulated."""
        if not self._observer:
            return
        if key.kind == Kind.EMULATED:
            status, reason = Kind.EMULATED.name, Reason.EMULATED
            self._observer.delivered(status, reason, aggregated=True, count=count)
            return
        status = errno.errorcode.get(key.status, str(key.status))
        self._observer.delivered(
            status,
            Reason.UNDIAGNOSED,
            aggregated=True,
            count=count,
            cause=UndiagnosedCause.EVICTED,
        )

    def dropped(self, kind: str) -> None:
        if self._observer:
            self._observer.dropped(kind)

    def overran(self, stage: str) -> None:
        if self._observer:
            self._observer.overran(stage)

    def emit(self, failure: ExecFailure) -> None:
        reason = failure.diagnosis.reason
        if reason in QUIET_REASONS and not self._show.get(reason, False):
            return  # counted, not printed nor published
        with self._lock:
            self._sink(failure)
