"""A small bounded delay queue: the earliest due item first, so that a retry waiting for
its turn never holds up a container that just appeared."""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from dataclasses import dataclass, field


@dataclass(order=True, frozen=True, slots=True)
class Prefetch:
    not_before: float
    seq: int
    container_id: str = field(compare=False)
    attempt: int = field(compare=False, default=0)


class DelayQueue:
    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._heap: list[Prefetch] = []
        self._cond = threading.Condition()
        self._seq = itertools.count()
        self._closed = False

    def put(self, container_id: str, attempt: int = 0, delay: float = 0.0) -> bool:
        """False when full or closed: the caller drops the item rather than wait."""
        with self._cond:
            if self._closed or len(self._heap) >= self._capacity:
                return False
            item = Prefetch(time.monotonic() + delay, next(self._seq), container_id, attempt)
            heapq.heappush(self._heap, item)
            self._cond.notify()
            return True

    def get(self) -> Prefetch | None:
        """The next due item, waiting as needed; None once closed."""
        with self._cond:
            while not self._closed:
                if self._heap:
                    wait = self._heap[0].not_before - time.monotonic()
                    if wait <= 0:
                        return heapq.heappop(self._heap)
                    self._cond.wait(wait)
                else:
                    self._cond.wait()
            return None

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._heap.clear()
            self._cond.notify_all()

    def __len__(self) -> int:
        with self._cond:
            return len(self._heap)
