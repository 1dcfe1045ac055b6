"""The BPF probe in a background thread: the kernel's own cgroup ids for failed execs."""

from __future__ import annotations

import errno
import threading
import time
from collections.abc import Callable
from types import TracebackType

from execwatch.probe import Probe
from execwatch.probe.events import boot_to_epoch_offset, decode_record
from execwatch.record import ExecFailed, KernelEvent

MAX_EVENTS = 10000


class ProbeRecorder:
    """Collects every failed exec while open; ``wait_for`` finds one by predicate."""

    def __init__(self) -> None:
        self._probe = Probe()
        self._events: list[KernelEvent] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> ProbeRecorder:
        self._probe.open()
        offset = boot_to_epoch_offset()
        self._probe.open_ring_buffer(lambda raw: self._append(decode_record(raw, offset)))
        self._thread = threading.Thread(target=self._poll, name="probe-recorder", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._probe.close()

    def _append(self, event: KernelEvent) -> None:
        with self._lock:
            self._events.append(event)
            if len(self._events) > MAX_EVENTS:  # other failures on a shared machine
                del self._events[: len(self._events) - MAX_EVENTS]

    def _poll(self) -> None:
        while not self._stop.is_set():
            self._probe.poll(50)

    def wait_for(
        self, predicate: Callable[[KernelEvent], bool], timeout: float = 10.0
    ) -> KernelEvent:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                for event in self._events:
                    if predicate(event):
                        return event
            time.sleep(0.01)
        raise AssertionError("the probe saw no matching failed exec")

    def failed_exec(
        self, path: str, err: int = errno.ENOEXEC, timeout: float = 10.0
    ) -> KernelEvent:
        """Wait for the failed exec of ``path`` (unique per container in these tests)."""

        def match(event: KernelEvent) -> bool:
            return isinstance(event, ExecFailed) and event.path == path and event.errno == err

        event = self.wait_for(match, timeout)
        self.take(match)
        return event

    def take(self, predicate: Callable[[KernelEvent], bool]) -> list[KernelEvent]:
        """Remove and return the matching events seen so far."""
        with self._lock:
            hits = [e for e in self._events if predicate(e)]
            self._events = [e for e in self._events if not predicate(e)]
        return hits
