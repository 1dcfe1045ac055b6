"""A work queue of API objects by key, de-duplicated, with per-item delays.

client-go's pattern: an object added again while queued replaces the queued copy (the
newest object wins), a retry waits its own backoff without holding up the others, and
`forget` drops an object the watch saw deleted. The handler keys its records by name;
the placement controller keys pods by namespace and name.
"""

from __future__ import annotations

import heapq
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


def by_name(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["name"])


def by_namespace_and_name(obj: dict[str, Any]) -> str:
    meta = obj["metadata"]
    return f"{meta.get('namespace') or ''}/{meta['name']}"


@dataclass
class WorkQueue:
    """Objects to handle by `key`, de-duplicated, with per-item delays for retries."""

    clock: Callable[[], float] = time.monotonic
    key: Callable[[dict[str, Any]], str] = by_name
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _items: dict[str, dict[str, Any]] = field(default_factory=dict)
    _heap: list[tuple[float, int, str]] = field(default_factory=list)
    _seq: int = 0
    _failures: dict[str, int] = field(default_factory=dict)

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
        deadline = self.clock() + timeout
        with self._cond:
            while True:
                while self._heap and self._heap[0][2] not in self._items:
                    heapq.heappop(self._heap)
                now = self.clock()
                if self._heap and self._heap[0][0] <= now:
                    _, _, name = heapq.heappop(self._heap)
                    return self._items.pop(name)
                wait = deadline - now
                if self._heap:
                    wait = min(wait, self._heap[0][0] - now)
                if wait <= 0:
                    return None
                self._cond.wait(wait)

    def retry_delay(self, name: str, initial: float, cap: float) -> float:
        with self._cond:
            n = self._failures.get(name, 0) + 1
            self._failures[name] = n
        delay: float = min(cap, initial * 2.0 ** (n - 1)) * random.uniform(0.8, 1.2)
        return delay

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

    def __len__(self) -> int:
        with self._cond:
            return len(self._items)
