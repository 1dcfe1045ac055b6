"""Warn mode: the webhook hands each admitted pod of a `warn` namespace to a worker that
judges it and posts the Event an enforced pod would get. The webhook never waits for it:
the handoff is a bounded queue, and a pod that finds it full gets no Event (logged)."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from execwatch.cluster import errors
from execwatch.placement.controller import Placer

log = logging.getLogger(__name__)


@dataclass
class WarnWorker:
    placer: Placer
    capacity: int = 256
    _queue: queue.Queue[tuple[str, Mapping[str, Any]] | None] = field(init=False)
    _thread: threading.Thread | None = None

    def __post_init__(self) -> None:
        self._queue = queue.Queue(self.capacity)

    def submit(self, namespace: str, pod: Mapping[str, Any]) -> None:
        """Called by the webhook: never blocks."""
        try:
            self._queue.put_nowait((namespace, pod))
        except queue.Full:
            log.warning("warn-mode queue full: no Event", extra={"kv": {"namespace": namespace}})

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="execwatch-warn", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is None:
            return
        self._queue.put(None)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            namespace, pod = item
            try:
                self.placer.warn(namespace, pod)
            except errors.ApiError as err:
                log.warning("warn-mode pod not judged", extra={"kv": errors.as_dict(err)})
