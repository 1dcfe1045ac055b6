"""Mitigation: evict a pod that keeps failing on its node's architecture, so that its
controller recreates it and placement sends the replacement where its image runs.

Driven by the handler's observed feed (observed.py), in namespaces labelled
`execwatch.io/placement=mitigate` only. A pod is evicted after `failures` platform-class
failures within `window`, once per pod UID, through the Eviction API (policy/v1: a
PodDisruptionBudget that forbids it answers 429, and the eviction is tried again later
with backoff), at most `rate` evictions a second for the whole cluster (one handler leads).
A pod that nothing would recreate (no controller owner) is never evicted: it gets a
Warning Event. DaemonSet pods are never evicted: their replacement comes back to the
same node.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cachetools import FIFOCache
from prometheus_client import CollectorRegistry, Counter

from execwatch.kube import errors
from execwatch.kube.client import Rest, path
from execwatch.kube.ratelimit import TokenBucket
from execwatch.placement.controller import Note, post_event
from execwatch.placement.modes import MITIGATE, NamespaceModes, never_placed

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Observation:
    """One counted platform-class failure of a pod's container, as the handler saw it."""

    namespace: str
    pod: str
    pod_uid: str
    container: str
    node_arch: str
    reason: str
    why: str  # one line: what failed and how
    count: int
    path: str = ""  # the file that failed, as the agent recorded the exec


@dataclass(frozen=True)
class MitigateConfig:
    failures: int = 3  # observed failures of one pod ...
    window: float = 600.0  # ... within this many seconds
    rate: float = 0.1  # evictions per second, cluster-wide
    burst: int = 5
    retry_initial: float = 10.0  # seconds before an eviction refused (429, 5xx) is retried
    retry_max: float = 300.0
    namespace_ttl: float = 30.0  # seconds a namespace's mode is believed
    max_pods: int = 4096  # pods remembered (failure windows, evicted, pending)


@dataclass
class _Pending:
    obs: Observation
    failures: int
    due: float
    attempts: int = 0


@dataclass
class MitigateMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        self.evictions = Counter(
            "execwatch_placement_evictions",
            "Pods that kept failing on their node's architecture in mitigate namespaces, by "
            "result: evicted; refused (429: a PodDisruptionBudget, retried later); failed "
            "(another API error: retried when it may pass); bare (no controller: a Warning "
            "Event, never evicted); gone (deleted or replaced before its eviction).",
            ["result"],
            registry=self.registry,
        )


@dataclass
class Mitigator:
    """Runs on the observed feed's one thread: no locks."""

    rest: Rest
    config: MitigateConfig
    metrics: MitigateMetrics
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    own_namespace: str = "execwatch"
    modes: NamespaceModes | None = None  # shared with the feedback; made when None
    # by pod UID, config.max_pods each, the oldest written forgotten first
    _windows: FIFOCache[str, deque[tuple[float, int]]] = field(init=False)
    _done: FIFOCache[str, None] = field(init=False)
    _pending: FIFOCache[str, _Pending] = field(init=False)
    _bucket: TokenBucket = field(init=False)  # config.rate evictions a second

    def __post_init__(self) -> None:
        self._windows = FIFOCache(self.config.max_pods)
        self._done = FIFOCache(self.config.max_pods)
        self._pending = FIFOCache(self.config.max_pods)
        self._bucket = TokenBucket(self.config.rate, self.config.burst, self.clock)
        if self.modes is None:
            self.modes = NamespaceModes(
                self.rest, self.own_namespace, self.config.namespace_ttl, clock=self.clock
            )

    def observed(self, obs: Observation, pod: Mapping[str, Any]) -> None:
        """One more failure of `pod` (as read after it): evict it when it keeps failing."""
        uid = obs.pod_uid
        if uid in self._done or uid in self._pending or _exempt(pod, self.own_namespace):
            return
        failures = self._count(uid, obs.count)
        if failures < self.config.failures or self._mode(obs.namespace) != MITIGATE:
            return
        self._windows.pop(uid, None)
        if _controller(pod) is None:
            self._done[uid] = None
            self.metrics.evictions.labels("bare").inc()
            self._event(obs, "PlacementNotMitigated", self._bare_note(obs, failures))
            return
        self._pending[uid] = _Pending(obs, failures, self.clock())
        self.tick()

    def tick(self) -> None:
        """Evict the pods whose turn has come, as far as the rate allows."""
        now = self.clock()
        for uid, pending in list(self._pending.items()):
            if pending.due > now:
                continue
            if not self._bucket.try_take():
                return
            self._evict(uid, pending)

    def pending(self) -> int:
        return len(self._pending)

    def _count(self, uid: str, count: int) -> int:
        now = self.clock()
        seen = self._windows.get(uid) or deque()
        seen.append((now, max(1, count)))
        while seen and seen[0][0] < now - self.config.window:
            seen.popleft()
        self._windows[uid] = seen
        return sum(n for _, n in seen)

    def _mode(self, namespace: str) -> str:
        """The namespace's placement mode ('' when none or unreadable: nothing is evicted)."""
        assert self.modes is not None
        try:
            return self.modes.mode(namespace)
        except errors.ApiError as err:
            log.warning(
                "namespace not read", extra={"kv": {"namespace": namespace, **errors.as_dict(err)}}
            )
            return ""

    def _evict(self, uid: str, pending: _Pending) -> None:
        obs = pending.obs
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": obs.pod, "namespace": obs.namespace},
            "deleteOptions": {"preconditions": {"uid": uid}},
        }
        url = path("api", "v1", "namespaces", obs.namespace, "pods", obs.pod, "eviction")
        try:
            self.rest.call("POST", url, body=body)
        except (errors.NotFoundError, errors.ConflictError):
            self._finish(uid, "gone")  # deleted, or replaced under its name
        except errors.RetryableError as err:  # 429 from a PodDisruptionBudget, 5xx, no answer
            self._later(uid, pending, "refused" if err.status == 429 else "failed", err)
        except errors.ApiError as err:  # RBAC or validation: asking again changes nothing
            self._finish(uid, "failed")
            log.warning(
                "eviction refused for good", extra={"kv": {"pod": uid, **errors.as_dict(err)}}
            )
        else:
            self._finish(uid, "evicted")
            self._event(obs, "PlacementMitigated", self._evicted_note(obs, pending.failures))

    def _later(self, uid: str, pending: _Pending, result: str, err: errors.ApiError) -> None:
        self.metrics.evictions.labels(result).inc()
        cfg = self.config
        delay = min(cfg.retry_max, cfg.retry_initial * 2**pending.attempts)
        pending.attempts += 1
        pending.due = self.clock() + errors.delay(err, delay)
        log.info(
            "eviction will be retried",
            extra={"kv": {"pod": uid, "delay": delay, **errors.as_dict(err)}},
        )

    def _finish(self, uid: str, result: str) -> None:
        self._pending.pop(uid, None)
        self._done[uid] = None
        self.metrics.evictions.labels(result).inc()

    def _event(self, obs: Observation, reason: str, message: str) -> None:
        subject = {
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": obs.namespace,
            "name": obs.pod,
            "uid": obs.pod_uid,
        }
        post_event(self.rest, subject, Note(reason, message, True, "Evict"), self.wall)

    def _what(self, obs: Observation, failures: int) -> str:
        minutes = max(1, round(self.config.window / 60))
        return (
            f"{failures} failures ({obs.reason}) of container {obs.container!r} on "
            f"{obs.node_arch} within {minutes} min: {obs.why}"
        )

    def _evicted_note(self, obs: Observation, failures: int) -> str:
        return (
            f"evicted: {self._what(obs, failures)}; its controller recreates it and "
            f"placement keeps the new pod off {obs.node_arch}"
        )

    def _bare_note(self, obs: Observation, failures: int) -> str:
        return (
            f"not evicted, nothing would recreate this bare pod: {self._what(obs, failures)}; "
            f"recreate it to have it placed where its image runs"
        )


def _controller(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller"):
            return ref
    return None


def _exempt(pod: Mapping[str, Any], own: str) -> bool:
    """Pods the gate never places: eviction would bring them back where they were."""
    meta = pod.get("metadata") or {}
    owner = _controller(pod)
    daemon = owner is not None and owner.get("kind") == "DaemonSet"
    return daemon or never_placed(str(meta.get("namespace") or ""), own)
