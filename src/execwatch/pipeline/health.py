"""How the node stack tells it is alive, and the sweep that keeps the kernel's per-cgroup
counts to the living."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger(__name__)

STALL_AFTER_S = 20.0
HealthCheck = Callable[[], "str | None"]


class PrunableCounts(Protocol):
    def forget_counts(self, keep: Callable[[int], bool]) -> int: ...


class CountsPruner:
    """Every `interval` seconds, drops the kernel's per-cgroup counts of removed cgroups,
    so that the 16,384-entry map never fills with the dead and `counter_map_full` counts
    only failures that really could not be counted per cgroup. Off the consume loop."""

    def __init__(
        self, probe: PrunableCounts, alive: Callable[[int], bool], interval: float = 30.0
    ) -> None:
        self._probe = probe
        self._alive = alive
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="counts-pruner", daemon=True)

    def __enter__(self) -> CountsPruner:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                removed = self._probe.forget_counts(self._alive)
            except Exception:  # a failed sweep is retried next time; never kill the agent
                log.exception("pruning the kernel counts failed")
                continue
            if removed:
                log.debug("kernel counts of removed cgroups dropped", extra={"kv": {"n": removed}})


class Heartbeat:
    """When the consume loop last went round, and the checks of what it depends on.
    Liveness fails when the loop stalls or diagnosis capacity is gone (no worker process
    alive and none can be started); a merely slow diagnosis never makes the agent look dead."""

    def __init__(self, stall_after: float = STALL_AFTER_S) -> None:
        self.stall_after = stall_after
        self._last = time.monotonic()
        self._checks: list[HealthCheck] = []

    def watch(self, check: HealthCheck) -> None:
        self._checks.append(check)

    def unwatch(self, check: HealthCheck) -> None:
        if check in self._checks:
            self._checks.remove(check)

    def beat(self, now: float | None = None) -> None:
        self._last = time.monotonic() if now is None else now

    def age(self) -> float:
        return time.monotonic() - self._last

    def problem(self) -> str | None:
        """None when healthy, else why not (for the /healthz answer)."""
        age = self.age()
        if age > self.stall_after:
            return f"the ring-buffer consume loop has not run for {age:.1f} s"
        return next((p for check in list(self._checks) if (p := check()) is not None), None)
