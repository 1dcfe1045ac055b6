"""The placement controller process: leader-elected, it watches gated pods and places them.

Only the replica holding the Lease writes. On becoming leader it lists every gated pod,
so whatever an old leader left gated is placed (or, past its budget, ungated) by the new
one. A pod whose patch fails is retried with its own backoff; a pod that no longer
carries the gate (placed by another, deleted) is dropped. When placement itself is
removed (`ungate_all`), every gated pod is ungated unchanged, so none is left behind.
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
from execwatch.cluster.rest import Rest, path
from execwatch.cluster.watcher import WatchConfig, Watcher
from execwatch.cluster.workqueue import WorkQueue, by_namespace_and_name
from execwatch.placement.affinity import ARCH_LABEL
from execwatch.placement.controller import Placer
from execwatch.placement.webhook import GATE, GATED_LABEL, GATED_VALUE

log = logging.getLogger(__name__)

MAX_REFUSALS = 3
PODS = path("api", "v1", "pods")
GATED = f"{GATED_LABEL}={GATED_VALUE}"


@dataclass(frozen=True)
class _WatchMetrics:
    api_errors: Any


@dataclass(frozen=True)
class ControllerConfig:
    lease: LeaseConfig  # the Lease execwatch-placement in execwatch's namespace
    workers: int = 16
    request_timeout: float = 10.0
    retry_initial: float = 0.5
    retry_max: float = 10.0


@dataclass
class PlacementController:
    config: ControllerConfig
    placer: Placer  # its `rest` also carries the watch and the Lease
    api_errors: Any  # a prometheus Counter with labels (verb, code)
    # more work for the leader only, each run in a thread of its own until its term ends
    leader_tasks: list[Callable[[threading.Event], None]] = field(default_factory=list)
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
                resource=PODS,
                label_selector=GATED,
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
            self.placer.rest,
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

    def ungate_all(self, cause: str) -> int:
        """Lift the gate of every gated pod, unchanged, saying `cause`: placement is being
        removed and no replica will place them. The number of pods ungated."""
        done, token = 0, ""
        while True:
            query: dict[str, str | int] = {"labelSelector": GATED, "limit": 100}
            if token:
                query["continue"] = token
            page = self.placer.rest.call("GET", PODS, query=query)
            for pod in page.get("items") or []:
                done += self._ungate(pod, cause)
            token = str((page.get("metadata") or {}).get("continue") or "")
            if not token:
                return done

    def _ungate(self, pod: dict[str, Any], cause: str) -> int:
        spec, meta = pod.get("spec") or {}, pod.get("metadata") or {}
        gated = any(g.get("name") == GATE for g in spec.get("schedulingGates") or [])
        if not gated or meta.get("deletionTimestamp"):
            return 0
        try:
            self.placer.fail_open(pod, cause)
        except errors.ApiError as err:  # placed or changed meanwhile: its patch test failed
            log.info("not ungated", extra={"kv": errors.as_dict(err)})
            return 0
        return 1

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
        for i, task in enumerate(self.leader_tasks):
            self._spawn(task, self._term, f"placement-leader-{i}")

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


@dataclass
class NodeArches:
    """The `kubernetes.io/arch` values of the cluster's nodes, listed at most once per
    `ttl` seconds. A failed list keeps the last answer for another `ttl`; with none yet,
    the error goes to the caller (the pod is retried)."""

    rest: Rest
    ttl: float = 60.0
    clock: Callable[[], float] = time.monotonic
    _arches: tuple[str, ...] | None = None
    _at: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self) -> tuple[str, ...]:
        with self._lock:
            if self._arches is None or self.clock() - self._at >= self.ttl:
                try:
                    self._arches, self._at = self._list(), self.clock()
                except errors.ApiError as err:
                    if self._arches is None:
                        raise
                    self._at = self.clock()  # the last answer stands for another ttl
                    log.info("node list failed", extra={"kv": errors.as_dict(err)})
            return self._arches

    def _list(self) -> tuple[str, ...]:
        found: set[str] = set()
        token = ""
        while True:
            query: dict[str, str | int] = {"labelSelector": ARCH_LABEL, "limit": 500}
            if token:
                query["continue"] = token
            page = self.rest.call("GET", path("api", "v1", "nodes"), query=query)
            for node in page.get("items") or []:
                found.add(str(((node.get("metadata") or {}).get("labels") or {})[ARCH_LABEL]))
            token = str((page.get("metadata") or {}).get("continue") or "")
            if not token:
                return tuple(sorted(found))
