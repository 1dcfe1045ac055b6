"""The handler's feedback to placement: what it saw fail, as sightings in ImageVerdicts.

When the handler counts a record whose reason is platform-class (`PLATFORM_REASONS`) for a
pod's container, it offers it here (`Feedback.offer` never waits: a bounded queue, drops
counted). One thread then reads the pod, keeps it only when its namespace is labelled
enforce or mitigate (modes.py), reads the container's image digest (its status'
`imageID`), writes a sighting for that digest on `linux/<node architecture>` (the
record's `nodeArch`: the agent's own node) scoped to the pod's namespace and owner, and
hands the failure to the mitigator (mitigate.py). New pods of that workload then avoid
that architecture; pods of other workloads only when the controller's own scan of the
image confirms the failing file is the image's (scanned.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cachetools import TTLCache
from prometheus_client import CollectorRegistry

from execwatch import crd
from execwatch.binfmt.platform import OCI_ARCHITECTURES
from execwatch.kube import errors
from execwatch.kube.client import Rest, path
from execwatch.placement.mitigate import MitigateConfig, MitigateMetrics, Mitigator, Observation
from execwatch.placement.modes import NamespaceModes
from execwatch.placement.verdicts import (
    DIGEST,
    Lane,
    Sighting,
    VerdictMetrics,
    VerdictStore,
    now_rfc3339,
    owner_of,
)
from execwatch.record import PLATFORM_REASONS

MAX_WHY_CHARS = 512
STATUSES = ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses")


@dataclass(frozen=True)
class FeedbackConfig:
    queue: int = 256  # failures waiting for the writer; more are dropped and counted
    rewrite_after: float = 300.0  # seconds before one digest and platform is written again
    own_namespace: str = crd.DEFAULT_NAMESPACE
    mitigate: MitigateConfig = field(default_factory=MitigateConfig)


def observation(rec: crd.ParsedRecord) -> Observation | None:
    """The record as a failure placement learns from, or None when it says nothing about
    where the image runs (another reason, no pod, an architecture no image names)."""
    if rec.reason not in PLATFORM_REASONS or not rec.names_pod or not rec.pod_uid:
        return None
    if rec.node_arch not in OCI_ARCHITECTURES or not rec.container:
        return None
    why = f"{rec.reason}: {rec.path}: {rec.detail}" if rec.detail else f"{rec.reason}: {rec.path}"
    return Observation(
        path=rec.path,
        namespace=rec.namespace,
        pod=rec.pod,
        pod_uid=rec.pod_uid,
        container=rec.container,
        node_arch=rec.node_arch,
        reason=str(rec.reason),
        why=why[:MAX_WHY_CHARS],
        count=rec.count,
    )


def image_digest(pod: Mapping[str, Any], container: str) -> tuple[str, str]:
    """(digest, image) the container runs, from the pod's status; ('', '') when its
    `imageID` names no sha256 manifest digest (not pulled yet, a local image)."""
    status = pod.get("status") or {}
    for key in STATUSES:
        for st in status.get(key) or []:
            if not isinstance(st, Mapping) or st.get("name") != container:
                continue
            repo, at, digest = str(st.get("imageID") or "").rpartition("@")
            if repo and at and DIGEST.fullmatch(digest):
                return digest, str(st.get("image") or "")
    return "", ""


@dataclass
class Feedback:
    rest: Rest
    config: FeedbackConfig = field(default_factory=FeedbackConfig)
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    wall: Callable[[], float] = time.time
    clock: Callable[[], float] = time.monotonic
    # the sightings written within rewrite_after, by digest and sighting key
    _written: TTLCache[tuple[str, ...], None] = field(init=False)

    def __post_init__(self) -> None:
        self._written = TTLCache(
            self.config.mitigate.max_pods, self.config.rewrite_after, timer=self.clock
        )
        self.metrics = VerdictMetrics(self.registry)
        self.store = VerdictStore(self.rest, self.wall)
        cfg = self.config
        self.modes = NamespaceModes(
            self.rest, cfg.own_namespace, cfg.mitigate.namespace_ttl, clock=self.clock
        )
        self.mitigator = Mitigator(
            self.rest,
            cfg.mitigate,
            MitigateMetrics(self.registry),
            clock=self.clock,
            wall=self.wall,
            own_namespace=cfg.own_namespace,
            modes=self.modes,
        )
        self.lane: Lane[Observation] = Lane(
            self._handle, "placement-feedback", self._dropped, self.config.queue,
            tick=self.mitigator.tick,
        )  # fmt: skip

    def offer(self, rec: crd.ParsedRecord) -> None:
        """From the handler's worker, once per counted record: never waits."""
        obs = observation(rec)
        if obs is not None:
            self.lane.offer(obs)

    def start(self) -> None:
        self.lane.start()

    def stop(self) -> None:
        self.lane.stop()

    def idle(self) -> bool:
        return self.lane.idle()

    def _handle(self, obs: Observation) -> None:
        pod = self._pod(obs)
        if pod is None or not self._opted_in(obs.namespace):
            return
        digest, image = image_digest(pod, obs.container)
        if digest and self._write(digest, image, obs, owner_of(pod)):
            self.mitigator.observed(obs, pod)

    def _opted_in(self, namespace: str) -> bool:
        """Only a namespace labelled enforce or mitigate feeds placement."""
        try:
            placed = self.modes.placed(namespace)
        except errors.ApiError:
            self.metrics.writes.labels("observed", "failed").inc()
            return False
        if not placed:
            self.metrics.writes.labels("observed", "ignored").inc()
        return placed

    def _pod(self, obs: Observation) -> dict[str, Any] | None:
        url = path("api", "v1", "namespaces", obs.namespace, "pods", obs.pod)
        try:
            pod = self.rest.call("GET", url)  # a quorum read: the newest imageID
        except errors.ApiError:
            self.metrics.writes.labels("observed", "failed").inc()
            return None
        return pod if (pod.get("metadata") or {}).get("uid") == obs.pod_uid else None

    def _write(self, digest: str, image: str, obs: Observation, owner: str) -> bool:
        """Write the sighting unless written lately; whether the verdict holds it."""
        seen = Sighting(
            f"linux/{obs.node_arch}", obs.namespace, owner, obs.path,
            now_rfc3339(self.wall), obs.why, obs.count,
        )  # fmt: skip
        key = (digest, *seen.key)
        if key in self._written:
            return True
        try:
            self.store.record(digest, image, [], [seen])
        except errors.ApiError:
            self.metrics.writes.labels("observed", "failed").inc()
            return False
        self.metrics.writes.labels("observed", "written").inc()
        self._written[key] = None
        return True

    def _dropped(self, obs: Observation) -> None:
        self.metrics.writes.labels("observed", "dropped").inc()


def feedback_hook(
    own_namespace: str,
) -> Callable[[Rest, CollectorRegistry, Callable[[], float]], Feedback]:
    """The handler's record hook (handler.controller.HookFactory): placement's feedback for
    the records of `own_namespace`."""

    def build(rest: Rest, registry: CollectorRegistry, wall: Callable[[], float]) -> Feedback:
        return Feedback(rest, FeedbackConfig(own_namespace=own_namespace), registry, wall=wall)

    return build
