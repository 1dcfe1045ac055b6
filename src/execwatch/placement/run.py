"""The placement controller process: leader-elected, it watches gated pods and places them.

Only the replica holding the Lease writes. On becoming leader it lists every gated pod,
so whatever an old leader left gated is placed (or, past its budget, ungated) by the new
one. A pod whose patch fails is retried with its own backoff; a pod that no longer
carries the gate (placed by another, deleted) is dropped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from execwatch.cluster import errors
from execwatch.cluster.lease import LeaseConfig, LeaseElector
from execwatch.cluster.rest import path
from execwatch.cluster.watcher import WatchConfig, Watcher
from execwatch.cluster.workqueue import WorkQueue, by_namespace_and_name
from execwatch.placement.controller import Placer
from execwatch.placement.webhook import GATED_LABEL, GATED_VALUE

log = logging.getLogger(__name__)

MAX_REFUSALS = 3


@dataclass(frozen=True)
class _WatchMetrics:
    api_errors: Any


@dataclass(frozen=True)
class ControllerConfig:
    lease: LeaseConfig  # the Lease execwatch-placement in execwatch's namespace
    workers: int = 4
    request_timeout: float = 10.0
    retry_initial: float = 0.5
    retry_max: float = 10.0


@dataclass
class PlacementController:
    config: ControllerConfig
    api_client: Any  # kubernetes.client.ApiClient
    placer: Placer
    api_errors: Any  # a prometheus Counter with labels (verb, code)
    clock: Callable[[], float] = time.monotonic
    _stop: threading.Event = field(default_factory=threading.Event)
    _term: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def __post_init__(self) -> None:
        cfg = self.config
        self.queue = WorkQueue(clock=self.clock, key=by_namespace_and_name)
        self.watcher = Watcher(
            WatchConfig(
                namespace=cfg.lease.namespace,
                resource=path("api", "v1", "pods"),
                label_selector=f"{GATED_LABEL}={GATED_VALUE}",
                request_timeout=cfg.request_timeout,
                list_page=100,
            ),
            self.placer.rest,
            self.queue,
            _WatchMetrics(self.api_errors),
            clock=self.clock,
        )
        self.elector = LeaseElector(
            cfg.lease,
            self.api_client,
            on_change=self._on_leader_change,
            clock=self.clock,
        )

    def start(self) -> None:
        self._spawn(self.elector.run, self._stop, "lease")

    def stop(self) -> None:
        self._stop.set()
        self._term.set()
        self.watcher.interrupt()
        for t in self._threads:
            t.join(timeout=10)

    def _on_leader_change(self, leading: bool) -> None:
        if not leading:
            self._term.set()
            self.watcher.interrupt()
            self.queue.clear()
            return
        self._term = threading.Event()
        self.queue.clear()
        self._spawn(self.watcher.run, self._term, "placement-watch")
        for i in range(self.config.workers):
            self._spawn(self._work, self._term, f"placement-{i}")

    def _spawn(
        self, target: Callable[[threading.Event], None], term: threading.Event, name: str
    ) -> None:
        self._threads = [t for t in self._threads if t.is_alive()]
        t = threading.Thread(target=target, args=(term,), name=f"execwatch-{name}", daemon=True)
        t.start()
        self._threads.append(t)

    def _work(self, term: threading.Event) -> None:
        while not term.is_set():
            pod = self.queue.get(timeout=0.5)
            if pod is None or not self.elector.is_leader():
                continue
            key = self.queue.key(pod)
            try:
                self.placer.handle(pod)
                self.queue.done(key)
            except errors.NotFoundError:
                self.queue.done(key)  # deleted meanwhile
            except (errors.PermanentError, errors.ConflictError) as err:
                self._refused(pod, key, err)
            except errors.ApiError as err:
                self._retry(pod, key, err)

    def _refused(self, pod: dict[str, Any], key: str, err: errors.ApiError) -> None:
        """The pod changed under the patch (its tests failed), or the API server refuses the
        placement itself: place the fresh pod again, and past MAX_REFUSALS lift the gate
        with the pod unchanged, so that no pod is ever left gated."""
        fresh = self.placer.refresh(pod)
        if fresh is None:
            self.queue.done(key)
        elif self.queue.failures(key) + 1 >= MAX_REFUSALS:
            self.placer.fail_open(fresh, f"the API server refused the placement: {err}")
            self.queue.done(key)
        else:
            self._retry(fresh, key, err)

    def _retry(self, pod: dict[str, Any], key: str, err: errors.ApiError) -> None:
        delay = self.queue.retry_delay(key, self.config.retry_initial, self.config.retry_max)
        log.info("will retry pod", extra={"kv": {"pod": key, **errors.as_dict(err)}})
        self.queue.add(pod, delay=errors.delay(err, delay))
