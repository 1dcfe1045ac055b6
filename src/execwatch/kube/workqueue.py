"""A work queue of API objects by key, de-duplicated, with per-item delays.

client-go's pattern: an object added again while queued replaces the queued copy (the
newest object wins), a retry waits its own backoff without holding up the others, and
`forget` drops an object the watch saw deleted. The handler keys its records by name;
the placement controller keys pods by namespace and name.

With `group` (the placement controller's: the pod's namespace), objects that are due are
handed out round-robin over their groups, and at most `share` of one group's are taken
and not yet `finished` at a time: one namespace's pods cannot hold every worker, nor make
another namespace's wait behind all of theirs.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from execwatch.kube import backoff


def by_name(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["name"])


def by_namespace_and_name(obj: dict[str, Any]) -> str:
    meta = obj["metadata"]
    return f"{meta.get('namespace') or ''}/{meta['name']}"


def by_namespace(obj: dict[str, Any]) -> str:
    return str(obj["metadata"].get("namespace") or "")


def _one_group(obj: dict[str, Any]) -> str:
    return ""


@dataclass
class WorkQueue:
    """Objects to handle by `key`, de-duplicated, with per-item delays for retries."""

    clock: Callable[[], float] = time.monotonic
    key: Callable[[dict[str, Any]], str] = by_name
    group: Callable[[dict[str, Any]], str] = _one_group
    share: int = 0  # objects of one group taken and not finished at most; 0: no limit
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _items: dict[str, dict[str, Any]] = field(default_factory=dict)
    _heap: list[tuple[float, int, str]] = field(default_factory=list)
    _seq: int = 0
    _failures: dict[str, int] = field(default_factory=dict)
    # due, by group; not a cache but the round-robin order of the groups (move_to_end)
    _ready: OrderedDict[str, deque[str]] = field(default_factory=OrderedDict)
    _queued: set[str] = field(default_factory=set)  # the keys in _ready
    _busy: Counter[str] = field(default_factory=Counter)  # taken, not finished, by group

    def add(self, obj: dict[str, Any], delay: float = 0.0) -> None:
        # managedFields is most of a record's size and nothing the handler reads: a queue
        # of thousands of records (a backlog) should not carry it.
        obj["metadata"].pop("managedFields", None)
        name = self.key(obj)
        with self._cond:
            fresh = name not in self._items
            self._items[name] = obj
            if fresh or delay == 0.0:
                self._seq += 1
                heapq.heappush(self._heap, (self.clock() + delay, self._seq, name))
            self._cond.notify()

    def forget(self, name: str) -> None:
        with self._cond:
            self._items.pop(name, None)
            self._failures.pop(name, None)

    def get(self, timeout: float) -> dict[str, Any] | None:
        """The next object due, by its group's turn; None after `timeout` seconds. With a
        `share`, whoever takes an object calls `finished` with it when done."""
        deadline = self.clock() + timeout
        with self._cond:
            while True:
                now = self.clock()
                self._promote(now)
                name = self._next()
                if name is not None:
                    obj = self._items.pop(name)
                    self._busy[self.group(obj)] += 1
                    return obj
                wait = deadline - now
                if self._heap:
                    wait = min(wait, self._heap[0][0] - now)
                if wait <= 0:
                    return None
                self._cond.wait(wait)

    def finished(self, obj: dict[str, Any]) -> None:
        """An object `get` returned is no longer worked on: its group's share is free."""
        with self._cond:
            group = self.group(obj)
            self._busy[group] -= 1
            if self._busy[group] <= 0:
                del self._busy[group]
            self._cond.notify_all()

    def take(self, pick: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
        """Remove and return the queued objects `pick` chooses (not those being worked on)."""
        with self._cond:
            chosen = [name for name, obj in self._items.items() if pick(obj)]
            return [self._items.pop(name) for name in chosen]

    def _promote(self, now: float) -> None:
        """Move what is due from the heap to its group's line."""
        while self._heap and self._heap[0][0] <= now:
            _, _, name = heapq.heappop(self._heap)
            if name in self._items and name not in self._queued:
                self._ready.setdefault(self.group(self._items[name]), deque()).append(name)
                self._queued.add(name)

    def _next(self) -> str | None:
        """The first due key of the first group in turn that is under its share."""
        for group in list(self._ready):
            line = self._ready[group]
            while line and line[0] not in self._items:
                self._queued.discard(line.popleft())
            if not line:
                del self._ready[group]
                continue
            if self.share and self._busy[group] >= self.share:
                continue
            name = line.popleft()
            self._queued.discard(name)
            self._ready.move_to_end(group)
            if not line:
                del self._ready[group]
            return name
        return None

    def retry_delay(self, name: str, initial: float, cap: float) -> float:
        with self._cond:
            n = self._failures.get(name, 0) + 1
            self._failures[name] = n
        return backoff.delay(n, initial, cap)

    def failures(self, name: str) -> int:
        """How many times this record has failed since it was last done."""
        with self._cond:
            return self._failures.get(name, 0)

    def done(self, name: str) -> None:
        with self._cond:
            self._failures.pop(name, None)

    def clear(self) -> None:
        with self._cond:
            self._items.clear()
            self._heap.clear()
            self._failures.clear()
            self._ready.clear()
            self._queued.clear()

    def __len__(self) -> int:
        with self._cond:
            return len(self._items)
