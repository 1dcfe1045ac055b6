"""A PodSource fed by the Kubernetes API: this node's pods only, kept by list + watch.

The API knows what CRI does not: init and ephemeral containers by role, and owners.
ReplicaSet and Job owners are followed one step up (to the Deployment or CronJob) in
the watch thread, never on the event path. Deleted pods stay as tombstones for a
while, so a failure seen just before a pod's deletion still gets its names.

The list + watch is `kube.watch.Watcher` on the agent's client (`kube.client.Rest`), this
cache its sink; objects are the API's JSON.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from cachetools import FIFOCache
from prometheus_client import CollectorRegistry, Counter

from execwatch.attribution.metadata import (
    ContainerMeta,
    ContainerRole,
    PodMeta,
    WorkloadRef,
    workload_from_owner,
)
from execwatch.kube import client, errors
from execwatch.kube.client import Rest
from execwatch.kube.watch import WatchConfig, Watcher

log = logging.getLogger(__name__)

STATUSES = (
    ("containerStatuses", ContainerRole.REGULAR),
    ("initContainerStatuses", ContainerRole.INIT),
    ("ephemeralContainerStatuses", ContainerRole.EPHEMERAL),
)


class KubernetesPodCache:
    """Thread-safe; ``pod()`` answers from memory. `rest`: the agent's client (default:
    in-cluster, else the kubeconfig)."""

    def __init__(
        self,
        node_name: str,
        *,
        rest: Any = None,
        tombstones: int = 4096,
        owner_cache: int = 4096,
        watch_timeout: int = 300,
        retry_delay: float = 5.0,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.node_name = node_name
        self._rest = rest
        self._watch_timeout = watch_timeout
        self._retry_delay = retry_delay
        self._registry = registry or CollectorRegistry()
        self._lock = threading.Lock()
        self._pods: dict[str, PodMeta] = {}
        self._tombstones: FIFOCache[str, PodMeta] = FIFOCache(tombstones)
        self._owners: FIFOCache[tuple[str, str, str], WorkloadRef | None] = FIFOCache(owner_cache)
        self._listing: list[dict[str, Any]] | None = None
        self._stop = threading.Event()
        self._watcher: Watcher | None = None
        self._thread: threading.Thread | None = None
        self.synced = threading.Event()

    def start(self) -> None:
        if self._rest is None:
            self._rest = Rest(client.load_config())
        config = WatchConfig(
            namespace="",
            resource=client.path("api", "v1", "pods"),
            field_selector=f"spec.nodeName={self.node_name}",
            watch_timeout=self._watch_timeout,
            retry_initial=self._retry_delay,
            retry_max=max(self._retry_delay, 30.0),
        )
        self._watcher = Watcher(config, self._rest, self, PodWatchMetrics(self._registry))
        self._thread = threading.Thread(
            target=self._watcher.run, args=(self._stop,), name="pod-cache", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._watcher is not None:
            self._watcher.interrupt()
        if self._thread is not None:
            self._thread.join(timeout=2)
            self._thread = None

    def pod(self, uid: str) -> PodMeta | None:
        with self._lock:
            return self._pods.get(uid) or self._tombstones.get(uid)

    # -- the watch's sink (kube.watch.WatchSink) -------------------------------------

    def listing(self) -> None:
        self._listing = []

    def upsert(self, obj: dict[str, Any]) -> None:
        if self._listing is not None:
            self._listing.append(obj)
        else:
            self.apply("MODIFIED", obj)

    def delete(self, obj: dict[str, Any]) -> None:
        self.apply("DELETED", obj)

    def listed(self) -> None:
        pods, self._listing = self._listing or [], None
        self.replace(pods)
        self.synced.set()

    def replace(self, pods: Iterable[dict[str, Any]]) -> None:
        """A full listing: pods no longer listed become tombstones."""
        fresh = {meta.uid: meta for meta in (self._to_meta(p) for p in pods) if meta}
        with self._lock:
            for uid, old in self._pods.items():
                if uid not in fresh:
                    self._bury(old)
            self._pods = fresh

    def apply(self, event_type: str, pod: dict[str, Any]) -> None:
        """One watch event: ADDED, MODIFIED or DELETED (BOOKMARK and ERROR are ignored)."""
        if event_type not in ("ADDED", "MODIFIED", "DELETED"):
            return
        meta = self._to_meta(pod)
        if meta is None:
            return
        with self._lock:
            if event_type == "DELETED":
                self._pods.pop(meta.uid, None)
                self._bury(meta)
            else:
                self._pods[meta.uid] = meta
                self._tombstones.pop(meta.uid, None)

    def _bury(self, meta: PodMeta) -> None:
        self._tombstones[meta.uid] = PodMeta(
            uid=meta.uid,
            namespace=meta.namespace,
            name=meta.name,
            workload=meta.workload,
            containers=meta.containers,
            labels=meta.labels,
            deleted=True,
        )

    def _to_meta(self, pod: dict[str, Any]) -> PodMeta | None:
        md = pod.get("metadata") or {}
        uid = md.get("uid")
        if not uid:
            return None
        labels: dict[str, str] = dict(md.get("labels") or {})
        namespace = md.get("namespace")
        containers: dict[str, ContainerMeta] = {}
        status = pod.get("status") or {}
        for attr, role in STATUSES:
            for cs in status.get(attr) or []:
                cid = _strip_scheme(cs.get("containerID"))
                if cid:
                    containers[cid] = ContainerMeta(cid, cs.get("name"), cs.get("image"), role)
        owner = _controller(md.get("ownerReferences"))
        workload = None
        if owner is not None:
            parents = self._parents(namespace, owner)
            workload = workload_from_owner(owner[0], owner[1], labels, parents)
        return PodMeta(
            uid=uid,
            namespace=namespace,
            name=md.get("name"),
            workload=workload,
            containers=containers,
            labels=labels,
        )

    def _parents(
        self, namespace: str | None, owner: tuple[str, str]
    ) -> dict[tuple[str, str], WorkloadRef | None] | None:
        """The ReplicaSet's or Job's own controller, from the API, cached; None if unknown."""
        kind, name = owner
        if kind not in ("ReplicaSet", "Job") or not namespace:
            return None
        key = (namespace, kind, name)
        with self._lock:
            if key in self._owners:
                return {owner: self._owners[key]}
        group = ("apis", "apps", "v1") if kind == "ReplicaSet" else ("apis", "batch", "v1")
        plural = "replicasets" if kind == "ReplicaSet" else "jobs"
        try:
            obj = self._rest.call("GET", client.path(*group, "namespaces", namespace, plural, name))
        except errors.ApiError as exc:
            log.debug("owner lookup failed", extra={"kind": kind, "name": name, "error": str(exc)})
            return None
        parent = _controller((obj.get("metadata") or {}).get("ownerReferences"))
        workload = WorkloadRef(*parent) if parent else None
        with self._lock:
            self._owners[key] = workload
        return {owner: workload}


def _controller(refs: Any) -> tuple[str, str] | None:
    for ref in refs or []:
        if isinstance(ref, dict) and ref.get("controller"):
            return str(ref.get("kind")), str(ref.get("name"))
    return None


@dataclass
class PodWatchMetrics:
    registry: CollectorRegistry

    def __post_init__(self) -> None:
        self.api_errors = Counter(
            "execwatch_pod_watch_api_errors",
            "Failed list and watch calls of the agent's pod watch (--pod-metadata=api), by "
            "verb and HTTP status (0: no answer).",
            ["verb", "code"],
            registry=self.registry,
        )


def _strip_scheme(container_id: str | None) -> str | None:
    """``containerd://<id>`` / ``cri-o://<id>`` / ``docker://<id>`` -> ``<id>``."""
    if not container_id:
        return None
    return container_id.rpartition("://")[2] or None
