"""A file with no `#!` (NoShebang) is benign or fatal by what its caller does next.

The kernel refuses such a file with ENOEXEC either way. A shell or glibc's execvp() then
runs it with /bin/sh (dash, busybox and execvp() exec a shell; bash reads it itself) and
all is well; a container runtime's init (runc, crun) gives up and exits, and the container
never starts: `exec /app/run.sh: exec format error`. The probe remembers each task whose
ENOEXEC record went out and, when it exits within the death window of the failure, sends
an enoexec exit (Kind.ENOEXEC_EXIT) saying how, and whether it exec'd since.

So a diagnosed NoShebang is held here until its caller's fate is known, at most the
window: an exit with a failing status or a fatal signal and no exec since makes it
MissingShebang (alerted); an exec, an exit 0 or a task still running when the window ends
leave it NoShebang. The exit usually comes first (runc exits 0.1 ms after the failure, the
diagnosis takes a millisecond), so exits are kept too, for as long. Both tables are
bounded: a failure released unjudged, an exit forgotten, or a caller gone with no word
from the kernel (a ring full, SIGKILL) is counted as a drop.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Generic, TypeVar

from execwatch.diagnosis import details
from execwatch.record import Diagnosis, EnoexecExit, ExecFailed, ExecFailure, Reason

T = TypeVar("T")  # what the caller holds with each failure (the pipeline's slot)
MAX_HELD = 1024  # failures waiting for their caller's fate
MAX_EXITS = 4096  # exits waiting for their failure's diagnosis (the kernel's EW_ENOEXEC_TASKS)
SLACK_S = 0.5  # beyond the window: the exit's record and the poll that brings it
FATE_HOLD_FULL = "fate_hold_full"  # PipelineObserver.dropped kinds
FATE_EXIT_FORGOTTEN = "fate_exit_forgotten"
FATE_LOST = "fate_lost"


@dataclass
class _Held(Generic[T]):
    token: T
    failure: ExecFailure
    deadline: float


def awaits_fate(failure: ExecFailure) -> bool:
    """Whether this failure's reason depends on what its caller does next."""
    return isinstance(failure.event, ExecFailed) and failure.diagnosis.reason is Reason.NO_SHEBANG


class Fates(Generic[T]):
    """Held NoShebang failures and the enoexec exits of their callers, each matched by the
    task (tgid) and the time of the failed exec. Thread-safe: the diagnosis workers hold,
    the consume loop brings exits and expires; verdicts are returned, never emitted here."""

    def __init__(
        self,
        window_s: float,
        *,
        dropped: Callable[[str], None],
        alive: Callable[[int], bool] | None = None,
        max_held: int = MAX_HELD,
        max_exits: int = MAX_EXITS,
    ) -> None:
        self.window_s = window_s
        self._wait = window_s + SLACK_S
        self._dropped = dropped
        self._alive = alive or _task_alive
        self._max_held = max_held
        self._max_exits = max_exits
        # Not caches but queues in deadline order (ordered dicts as such): every entry
        # leaves with a verdict, or is counted as dropped (FATE_HOLD_FULL, _EXIT_FORGOTTEN).
        self._held: OrderedDict[int, list[_Held[T]]] = OrderedDict()  # by tgid, oldest first
        self._count = 0
        self._exits: OrderedDict[tuple[int, float], tuple[EnoexecExit, float]] = OrderedDict()
        self._lock = threading.Lock()

    def hold(self, token: T, failure: ExecFailure, now: float) -> list[tuple[T, ExecFailure]]:
        """Hold `failure` until its caller's fate is known: the verdicts ready now (its own,
        when its caller's exit came first; the oldest held, released unjudged, when full)."""
        event = failure.event
        with self._lock:
            exit_ = self._exits.pop((event.tgid, event.time), None)
            if exit_ is not None:
                return [(token, judge(failure, exit_[0]))]
            out = []
            if self._count >= self._max_held:
                out.append(self._pop_oldest())
            self._held.setdefault(event.tgid, []).append(_Held(token, failure, now + self._wait))
            self._count += 1
        if out:
            self._dropped(FATE_HOLD_FULL)
        return [(t, f) for t, f in out]

    def exited(self, event: EnoexecExit, now: float) -> list[tuple[T, ExecFailure]]:
        """An enoexec exit: the verdict of the failure it follows, or kept until that
        failure is diagnosed (when the table is full, the oldest exit is forgotten)."""
        forgotten = 0
        with self._lock:
            found = self._take(event.tgid, event.failed_time)
            if found is not None:
                return [(found.token, judge(found.failure, event))]
            self._exits[(event.tgid, event.failed_time or 0.0)] = (event, now + self._wait)
            while len(self._exits) > self._max_exits:
                self._exits.popitem(last=False)
                forgotten += 1
        for _ in range(forgotten):
            self._dropped(FATE_EXIT_FORGOTTEN)
        return []

    def expire(self, now: float, *, final: bool = False) -> list[tuple[T, ExecFailure]]:
        """Failures whose window has passed (all, when final) with no failing exit: their
        callers went on, or are gone without a word from the kernel (counted as lost)."""
        due: list[_Held[T]] = []
        with self._lock:
            for tgid in list(self._held):
                held = self._held[tgid]
                keep = [h for h in held if not (final or h.deadline <= now)]
                due += [h for h in held if h not in keep]
                if keep:
                    self._held[tgid] = keep
                else:
                    del self._held[tgid]
            self._count -= len(due)
            while self._exits and next(iter(self._exits.values()))[1] <= now:
                self._exits.popitem(last=False)  # a foreign ELF's caller, most often
        out = []
        for h in due:
            fate = _unknown("stopping") if final else self._went_on(h.failure.event.tgid)
            if fate is _LOST:
                self._dropped(FATE_LOST)
            out.append((h.token, went_on(h.failure, fate)))
        return out

    def _take(self, tgid: int, failed_time: float | None) -> _Held[T] | None:
        held = self._held.get(tgid)
        if not held:
            return None
        match = next((h for h in held if h.failure.event.time == failed_time), None)
        if match is None:
            return None
        held.remove(match)
        if not held:
            del self._held[tgid]
        self._count -= 1
        return match

    def _pop_oldest(self) -> tuple[T, ExecFailure]:
        tgid, held = next(iter(self._held.items()))
        first = held.pop(0)
        if not held:
            del self._held[tgid]
        self._count -= 1
        return first.token, went_on(first.failure, _unknown("too many were waiting"))

    def _went_on(self, tgid: int) -> str:
        if self._alive(tgid):
            return _CARRIED_ON.format(window=self.window_s)
        return _LOST


_CARRIED_ON = "its caller went on: it kept running for {window:g} s"
_LOST = "its caller is gone and the kernel's word on how it ended was lost"


def _unknown(why: str) -> str:
    return f"not waited for its caller's fate: {why}"


def _task_alive(tgid: int) -> bool:
    return os.path.exists(f"/proc/{tgid}")


def went_on(failure: ExecFailure, fate: str) -> ExecFailure:
    """NoShebang, with what its caller did (or what is not known of it)."""
    return replace(failure, diagnosis=_with_fate(failure.diagnosis, Reason.NO_SHEBANG, fate))


def judge(failure: ExecFailure, exit_: EnoexecExit) -> ExecFailure:
    """The verdict of an exit within the window: after an exec, its caller retried (a shell
    or execvp() running the file with /bin/sh); with no exec since the failure, a failing
    status or a fatal signal is MissingShebang (its caller gave up, as a runtime's init
    does), and status 0 means it ran the file itself (bash does) and all went well."""
    how = details.exit_status(exit_.exit_code, exit_.signal)
    after = f"{exit_.age_ms or 0.0:.1f} ms later"
    if exit_.execed:
        fate = (
            f"its caller ran another program next (as a shell or execvp() does, retrying"
            f" it with /bin/sh) and {how} {after}"
        )
        return went_on(failure, fate)
    if exit_.exit_code == 0:
        fate = f"its caller ran it itself (as bash does) and {how} {after}"
        return went_on(failure, fate)
    fate = (
        f"{exit_.comm or 'its caller'} {how} {after} without running anything else:"
        " nothing retried it with a shell"
    )
    return replace(failure, diagnosis=_with_fate(failure.diagnosis, Reason.MISSING_SHEBANG, fate))


def _with_fate(diagnosis: Diagnosis, reason: Reason, fate: str) -> Diagnosis:
    return replace(diagnosis, reason=reason, detail=f"{diagnosis.detail}; {fate}")
