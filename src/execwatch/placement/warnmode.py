"""Warn mode: the validating webhook hands each admitted pod of a `warn` namespace to a
worker that judges it and posts the Event an enforced pod would get. The webhook never
waits for it: the handoff is a bounded queue, and a pod that finds it full gets no Event
(logged).

Only the pod's namespace, name and UID are handed on. The worker reads the pod again from
the API server (it is stored once every webhook has answered: the first read waits a
little, and a pod not there yet is read again a few times), and judges it only when it is
the same pod (UID), its namespace is labelled `execwatch.io/placement=warn` and it is not
one placement never touches. So whatever a POST to `/warn` says, the pod judged, the
secrets read and the Event posted are those of a real pod of an opted-in namespace.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from execwatch.kube import errors
from execwatch.kube.client import path
from execwatch.placement.controller import Placer
from execwatch.placement.webhook import MODE_LABEL, PodRef, pod_skip_reason

log = logging.getLogger(__name__)

# Seconds after the review at which the pod is read, while the API server has not stored
# it yet (its create waits for every webhook, then for etcd); after the last, it is dropped.
READ_AFTER = (0.1, 0.5, 1.5, 3.5)

Pending = tuple[float, int, float, PodRef, int]  # (due, tie-breaker, submitted, pod, attempt)


@dataclass
class WarnWorker:
    placer: Placer
    own_namespace: str
    capacity: int = 256
    read_after: tuple[float, ...] = READ_AFTER
    clock: Callable[[], float] = time.monotonic
    _queue: queue.Queue[tuple[float, PodRef] | None] = field(init=False)
    _thread: threading.Thread | None = None
    _outstanding: int = field(default=0, init=False)  # submitted, not yet done
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def __post_init__(self) -> None:
        self._queue = queue.Queue(self.capacity)

    def submit(self, ref: PodRef) -> None:
        """Called by the webhook: never blocks."""
        try:
            with self._lock:
                self._queue.put_nowait((self.clock(), ref))
                self._outstanding += 1
        except queue.Full:
            log.warning(
                "warn-mode queue full: no Event", extra={"kv": {"namespace": ref.namespace}}
            )

    def idle(self) -> bool:
        """Every pod submitted is judged or dropped: nothing waits to be read."""
        with self._lock:
            return self._outstanding == 0

    def _done(self) -> None:
        with self._lock:
            self._outstanding -= 1

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="execwatch-warn", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is None:
            return
        self._queue.put(None)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        pending: list[Pending] = []
        order = itertools.count()
        while True:
            wait = None if not pending else max(0.0, pending[0][0] - self.clock())
            item: tuple[float, PodRef] | tuple[()] | None = ()
            with contextlib.suppress(queue.Empty):
                item = self._queue.get(timeout=wait)
            if item is None:
                return
            if item and len(pending) >= self.capacity:
                self._done()  # more pods than the queue holds are waiting: no Event
            elif item:
                submitted, ref = item
                due = submitted + self.read_after[0]
                heapq.heappush(pending, (due, next(order), submitted, ref, 0))
            while pending and pending[0][0] <= self.clock():
                _, _, submitted, ref, attempt = heapq.heappop(pending)
                if not self._handle(ref) and attempt + 1 < len(self.read_after):
                    due = submitted + self.read_after[attempt + 1]
                    heapq.heappush(pending, (due, next(order), submitted, ref, attempt + 1))
                else:
                    self._done()

    def _handle(self, ref: PodRef) -> bool:
        """Judge the pod `ref` names; False when it is not stored (yet)."""
        try:
            pod = self._get(path("api", "v1", "namespaces", ref.namespace, "pods", ref.name))
            if pod is None:
                return False
            if self._judged(ref, pod):
                self.placer.warn(ref.namespace, pod)
        except errors.ApiError as err:
            log.warning("warn-mode pod not judged", extra={"kv": errors.as_dict(err)})
        return True

    def _judged(self, ref: PodRef, pod: dict[str, Any]) -> bool:
        """The stored pod is the one reviewed, in a `warn` namespace, and placeable."""
        if (pod.get("metadata") or {}).get("uid") != ref.uid:
            return False
        namespace = self._get(path("api", "v1", "namespaces", ref.namespace)) or {}
        labels = (namespace.get("metadata") or {}).get("labels") or {}
        if labels.get(MODE_LABEL) != "warn":
            return False
        return pod_skip_reason(ref.namespace, pod, self.own_namespace) is None

    def _get(self, url: str) -> dict[str, Any] | None:
        try:
            got: dict[str, Any] = self.placer.rest.call("GET", url)
        except errors.NotFoundError:
            return None
        return got
