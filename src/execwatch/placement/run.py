"""The placement controller process: leader-elected, it watches gated pods and places them.

Only the replica holding the Lease writes. On becoming leader it lists every gated pod,
so whatever an old leader left gated is placed (or, past its budget, ungated) by the new
one. A pod whose patch fails is retried with its own backoff; a pod that no longer
carries the gate (placed by another, deleted) is dropped. When placement itself is
removed (`ungate_all`), every gated pod is ungated unchanged, so none is left behind.

Gated pods are handed to the workers round-robin over their namespaces. One namespace
holds at most `workers` workers at once, and the pool has `spare` more, so the pods of
one namespace, however slow their registry, cannot stall another's. A reaper ungates
unchanged every pod past its budget plus `grace`, queued or being judged, whatever its
worker is doing, and gives the pool a new worker for each one stuck on a reaped pod (at
most `workers` more).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from execwatch.kube import errors
from execwatch.kube.client import Rest, path
from execwatch.kube.lease import LeaseConfig, LeaseElector
from execwatch.kube.watch import QueueSink, WatchConfig, Watcher
from execwatch.kube.workqueue import WorkQueue, by_namespace, by_namespace_and_name
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
    grace: float = 5.0  # seconds past a pod's budget before the reaper ungates it
    reap_every: float = 0.5

    @property
    def spare(self) -> int:
        """Workers beyond `workers`, which one namespace alone never holds: an eighth."""
        return max(1, self.workers // 8)


@dataclass
class _Job:
    """A pod a worker is judging: when its budget ends, and whether the reaper took it."""

    pod: dict[str, Any]
    deadline: float
    reaped: bool = False
    replaced: bool = False  # a new worker was started in place of the one stuck on it


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
    _jobs: dict[int, _Job] = field(default_factory=dict)  # by worker thread
    _extra: int = 0  # workers started in place of stuck ones and not yet gone
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        cfg = self.config
        self.queue = WorkQueue(
            clock=self.clock, key=by_namespace_and_name, group=by_namespace, share=cfg.workers
        )
        self.watcher = Watcher(
            WatchConfig(
                namespace=cfg.lease.namespace,
                resource=PODS,
                label_selector=GATED,
                request_timeout=cfg.request_timeout,
                list_page=100,
            ),
            self.placer.rest,
            QueueSink(self.queue),
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
        end = time.monotonic() + 10  # a worker stuck on a registry is a daemon: not waited on
        for t in self._threads:
            t.join(timeout=max(0.0, end - time.monotonic()))

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
        for i in range(self.config.workers + self.config.spare):
            self._spawn(self._work, self._term, f"placement-{i}")
        self._spawn(self._reap, self._term, "placement-reaper")
        for i, task in enumerate(self.leader_tasks):
            self._spawn(task, self._term, f"placement-leader-{i}")

    def _spawn(
        self, target: Callable[[threading.Event], None], term: threading.Event, name: str
    ) -> None:
        t = threading.Thread(target=target, args=(term,), name=f"execwatch-{name}", daemon=True)
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(t)
        t.start()

    def _work(self, term: threading.Event) -> None:
        while not term.is_set():
            pod = self.queue.get(timeout=0.5)
            if pod is None:
                continue
            try:
                job = self._judge(pod) if self.elector.is_leader() else None
            finally:
                self.queue.finished(pod)
            if job is not None and job.replaced:
                with self._lock:
                    self._extra -= 1
                return  # a new worker took this one's place while it was stuck

    def _judge(self, pod: dict[str, Any]) -> _Job:
        me = threading.get_ident()
        job = _Job(pod, self.placer.deadline(pod))
        with self._lock:
            self._jobs[me] = job
        try:
            self._handle(pod)
        finally:
            with self._lock:
                self._jobs.pop(me, None)
        return job

    def _handle(self, pod: dict[str, Any]) -> None:
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

    def _reap(self, term: threading.Event) -> None:
        """Ungate, unchanged, every pod past its budget plus grace: those being judged,
        whatever their worker waits on, and those still queued."""
        while not term.wait(self.config.reap_every):
            late = self.placer.clock() - self.config.grace
            with self._lock:
                stuck = [j for j in self._jobs.values() if not j.reaped and j.deadline < late]
                for job in stuck:
                    job.reaped = True
            for job in stuck:
                self._reaped(job.pod)
                self._replace(job, term)
            for pod in self.queue.take(functools.partial(self._late, late)):
                if not self._reaped(pod):
                    self.queue.add(pod, delay=self.config.retry_max)

    def _late(self, late: float, pod: dict[str, Any]) -> bool:
        return self.placer.deadline(pod) < late

    def _reaped(self, pod: dict[str, Any]) -> bool:
        """Ungate the pod unchanged if its namespace is served; False on an API error."""
        cause = f"no verdict within {self.placer.budget:g} s of the pod's creation"
        try:
            if self.placer.serves(pod):
                self.placer.fail_open(pod, cause)
        except errors.NotFoundError:
            return True
        except errors.ApiError as err:  # placed meanwhile (its patch test failed)
            log.info("reaper did not ungate", extra={"kv": errors.as_dict(err)})
            return False
        return True

    def _replace(self, job: _Job, term: threading.Event) -> None:
        """A new worker in place of the one stuck on `job`, at most `workers` extra."""
        with self._lock:
            if self._extra >= self.config.workers:
                return
            self._extra += 1
            job.replaced = True
        self._spawn(self._work, term, "placement-spare")

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
