"""The handler's feedback to placement: what it saw fail, as observed verdicts.

When the handler counts a record whose reason is platform-class (`PLATFORM_REASONS`) for a
pod's container, it offers it here (`Feedback.offer` never waits: a bounded queue, drops
counted). One thread then reads the pod for the container's image digest (its status'
`imageID`), writes `fails (observed)` for that digest on `linux/<node architecture>` (the
record's `nodeArch`: the agent's own node), and hands the failure to the mitigator
(mitigate.py). New pods of that digest in enforce and mitigate namespaces then avoid that
architecture, whatever their image's manifest claims.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

from execwatch.binfmt.platform import OCI_ARCHITECTURES
from execwatch.cluster import crd, errors
from execwatch.cluster.rest import Rest, path
from execwatch.placement.decision import Outcome
from execwatch.placement.mitigate import MitigateConfig, MitigateMetrics, Mitigator, Observation
from execwatch.placement.verdicts import (
    DIGEST,
    Lane,
    PlatformVerdict,
    VerdictMetrics,
    VerdictStore,
    now_rfc3339,
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


def observation(rec: crd.Record) -> Observation | None:
    """The record as a failure placement learns from, or None when it says nothing about
    where the image runs (another reason, no pod, an architecture no image names)."""
    if rec.reason not in PLATFORM_REASONS or not rec.names_pod or not rec.pod_uid:
        return None
    if rec.node_arch not in OCI_ARCHITECTURES or not rec.container:
        return None
    why = f"{rec.reason}: {rec.path}: {rec.detail}" if rec.detail else f"{rec.reason}: {rec.path}"
    return Observation(
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
    _written: OrderedDict[tuple[str, str], float] = field(default_factory=OrderedDict)

    def __post_init__(self) -> None:
        self.metrics = VerdictMetrics(self.registry)
        self.store = VerdictStore(self.rest, self.wall)
        self.mitigator = Mitigator(
            self.rest,
            self.config.mitigate,
            MitigateMetrics(self.registry),
            clock=self.clock,
            wall=self.wall,
            own_namespace=self.config.own_namespace,
        )
        self.lane: Lane[Observation] = Lane(
            self._handle, "placement-feedback", self._dropped, self.config.queue,
            tick=self.mitigator.tick,
        )  # fmt: skip

    def offer(self, rec: crd.Record) -> None:
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
        if pod is None:
            return
        digest, image = image_digest(pod, obs.container)
        if digest and self._write(digest, image, obs):
            self.mitigator.observed(obs, pod)

    def _pod(self, obs: Observation) -> dict[str, Any] | None:
        url = path("api", "v1", "namespaces", obs.namespace, "pods", obs.pod)
        try:
            pod = self.rest.call("GET", url)  # a quorum read: the newest imageID
        except errors.ApiError:
            self.metrics.writes.labels("observed", "failed").inc()
            return None
        return pod if (pod.get("metadata") or {}).get("uid") == obs.pod_uid else None

    def _write(self, digest: str, image: str, obs: Observation) -> bool:
        """Write `fails (observed)` unless written lately; whether the verdict says so."""
        platform = f"linux/{obs.node_arch}"
        key, now = (digest, platform), self.clock()
        if now - self._written.get(key, -self.config.rewrite_after) < self.config.rewrite_after:
            return True
        seen = PlatformVerdict(
            platform, Outcome.FAILS, "observed", now_rfc3339(self.wall), (obs.why,), obs.count
        )
        try:
            self.store.record(digest, image, [seen])
        except errors.ApiError:
            self.metrics.writes.labels("observed", "failed").inc()
            return False
        self.metrics.writes.labels("observed", "written").inc()
        self._written[key] = now
        while len(self._written) > self.config.mitigate.max_pods:
            self._written.popitem(last=False)
        return True

    def _dropped(self, obs: Observation) -> None:
        self.metrics.writes.labels("observed", "dropped").inc()
