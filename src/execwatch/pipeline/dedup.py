"""Repeats: which ring-buffer records repeat one already queued or diagnosed, and how many
repeats of each are not emitted yet. Recognised on the raw record (a RepeatKey), before
decoding, so a failure storm stays cheap: one diagnosis per key, exact counts."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from cachetools import FIFOCache

from execwatch.record import ExecFailure, RepeatKey


@dataclass
class Slot:
    """One key's first occurrence (while it is diagnosed, then its diagnosed record) and
    the repeats that followed it."""

    key: RepeatKey
    failure: ExecFailure | None  # the diagnosed first occurrence; None while diagnosing
    latest: bytes  # raw record of the newest repeat
    pending: int  # repeats not emitted yet
    last_seen: float
    opened: float  # when its first occurrence came: its diagnosis is that old
    unreported: int = 0  # repeats that arrived before the diagnosis: counted once it is known
    closed: bool = False  # emitted without waiting for its diagnosis (shutdown)
    held: bool = False  # diagnosed, its reason waiting for its caller's fate (fates.py)


class Repeats:
    """The slot table. A key idle for ten windows, or diagnosed `rediagnose_after` seconds
    ago, starts afresh (a new diagnosis); at most `max_slots` keys, the oldest evicted.
    Thread-safe; never calls out under its lock."""

    def __init__(self, window: float, max_slots: int, rediagnose_after: float = 60.0) -> None:
        self.window = window
        self._rediagnose_after = rediagnose_after
        self._slots: FIFOCache[RepeatKey, Slot] = FIFOCache(max_slots)
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._unsettled = 0  # slots whose first occurrence is not emitted yet

    def repeat(self, key: RepeatKey, raw: bytes, now: float) -> tuple[bool, ExecFailure | None]:
        """Fold `raw` into `key`'s slot if it has one still fresh: (folded, the diagnosis of
        its first occurrence if known, else None: then it is counted when it is)."""
        with self._lock:
            slot = self._slots.get(key)
            if slot is None or now - slot.last_seen >= self.window * 10:
                return False, None
            if now - slot.opened >= self._rediagnose_after:
                return False, None
            slot.pending += 1
            slot.latest = raw
            slot.last_seen = now
            slot.unreported += slot.failure is None
            return True, slot.failure

    def open(self, key: RepeatKey, raw: bytes, now: float) -> tuple[Slot, list[Slot]]:
        """A new slot for `key`, its first occurrence to diagnose, and the slots it pushed
        out (key's stale one, the oldest beyond max_slots), to be emitted as they are."""
        with self._lock:
            stale = self._slots.pop(key, None)
            evicted = [stale] if stale is not None else []
            while len(self._slots) >= self._slots.maxsize:  # evicted here, to be emitted
                evicted.append(self._slots.popitem()[1])
            slot = Slot(key, None, raw, 0, now, now)
            self._slots[key] = slot
            self._unsettled += 1
        return slot, evicted

    def absorb(self, key: RepeatKey, n: int) -> tuple[bool, ExecFailure | None]:
        """Credit `n` repeats the kernel folded to `key`'s slot: (found, its diagnosis)."""
        with self._lock:
            slot = self._slots.get(key)
            if slot is None:
                return False, None
            known = slot.failure
            slot.pending += n
            slot.last_seen = time.monotonic()
            slot.unreported += n if known is None else 0
            return True, known

    def settle(self, slot: Slot, failure: ExecFailure) -> int | None:
        """Record the first occurrence's diagnosis: the repeats it now accounts for, or
        None when the slot was settled already (by the watchdog, or at shutdown)."""
        with self._lock:
            if slot.failure is not None or slot.closed or slot.held:
                return None
            slot.failure = failure
            unreported, slot.unreported = slot.unreported, 0
            return unreported

    def hold(self, slot: Slot) -> bool:
        """The first occurrence is diagnosed but its reason waits (fates.py): its repeats
        stay unreported until `release`. False when the slot was settled already."""
        with self._lock:
            if slot.failure is not None or slot.closed or slot.held:
                return False
            slot.held = True
            return True

    def release(self, slot: Slot, failure: ExecFailure) -> int | None:
        """A held slot's verdict: as `settle`."""
        with self._lock:
            if not slot.held:
                return None
            slot.held = False
            slot.failure = failure
            unreported, slot.unreported = slot.unreported, 0
            return unreported

    def evicted(self, slot: Slot) -> bool:
        with self._lock:
            return self._slots.get(slot.key) is not slot

    def settled(self) -> None:
        """A settled slot's first occurrence has been emitted."""
        with self._idle:
            self._unsettled -= 1
            self._idle.notify_all()

    def close(self, slot: Slot) -> int | None:
        """Give up waiting for `slot`'s diagnosis (shutdown): its repeats, or None when it
        was settled already."""
        with self._idle:
            if slot.failure is not None or slot.closed or slot.held:
                return None
            slot.closed = True
            self._unsettled -= 1
            self._idle.notify_all()
            pending, slot.pending = slot.pending, 0
            return pending

    def take_pending(self, slot: Slot) -> tuple[ExecFailure, bytes, int] | None:
        """The diagnosed first occurrence, the newest repeat and the repeats' count."""
        with self._lock:
            if slot.failure is None or not slot.pending:
                return None
            count, slot.pending = slot.pending, 0
            return slot.failure, slot.latest, count

    def slots(self) -> list[Slot]:
        with self._lock:
            return list(self._slots.values())

    def forget_idle(self, slot: Slot, now: float, *, final: bool) -> None:
        """Forget `slot` when it has been idle ten windows (or always, when final)."""
        if final or now - slot.last_seen >= self.window * 10:
            with self._lock:
                if self._slots.get(slot.key) is slot:
                    del self._slots[slot.key]

    def wait_settled(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._unsettled:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._idle.wait(remaining)
        return True
