"""What the handler may believe about the pod a record names, and the pod label.

A record is the word of one node; the pod is checked against the API server. Reads are
cheap where the answer cannot be wrong and exact where it decides something:

- a pod's UID and `spec.nodeName` (once set) never change, so a pod seen once with the
  record's UID answers later records for it from a bounded cache;
- otherwise the pod is read from the API server's watch cache (`resourceVersion=0`: no
  etcd round trip);
- only before declaring a pod missing, replaced (another UID) or not yet bound is it read
  again with a quorum read, because the watch cache may lag behind a just-created pod.

No list or watch of pods: the handler keeps `get` on pods, not the right to read every
pod's spec in the cluster.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from typing import Any

from cachetools import LRUCache

from execwatch.attribution.metadata import workload_from_owner
from execwatch.kube import errors
from execwatch.kube.client import MERGE_PATCH, Rest, path

LABEL = "execwatch.io/exec-failure"


@dataclass(frozen=True, slots=True)
class Pod:
    """The facts of one pod the handler uses; all but `label` are immutable."""

    namespace: str
    name: str
    uid: str
    node: str
    workload: str
    containers: frozenset[str]  # names of its containers, init and ephemeral ones included
    label: str | None  # the value of LABEL when last read or written


def workload_of(pod: dict[str, Any]) -> tuple[str, str]:
    """(kind, name) of the pod's controller, without reading ReplicaSets or Jobs.

    A ReplicaSet whose pods carry `pod-template-hash` belongs to a Deployment named by
    the ReplicaSet name minus that hash; this is how Tetragon and kube-state-metrics
    users name workloads, and it needs no extra RBAC.
    """
    meta = pod.get("metadata") or {}
    owners = [o for o in meta.get("ownerReferences") or [] if o.get("controller")]
    owner = owners[0] if owners else {}
    labels = meta.get("labels") or {}
    workload = workload_from_owner(owner.get("kind"), owner.get("name"), labels)
    return (workload.kind, workload.name) if workload else ("Pod", str(meta.get("name", "")))


MAX_CONTAINERS = 256


def _containers(spec: dict[str, Any]) -> frozenset[str]:
    names = (
        c.get("name")
        for key in ("containers", "initContainers", "ephemeralContainers")
        for c in (spec.get(key) or [])[:MAX_CONTAINERS]
        if isinstance(c, dict)
    )
    return frozenset(n for n in names if isinstance(n, str))


def _facts(obj: dict[str, Any]) -> Pod:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    return Pod(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        node=str(spec.get("nodeName") or ""),
        workload=workload_of(obj)[1],
        containers=_containers(spec),
        label=(meta.get("labels") or {}).get(LABEL),
    )


@dataclass
class PodReader:
    rest: Rest
    cache_size: int = 8192
    _lock: threading.Lock = field(default_factory=threading.Lock)
    cached_reads: int = 0
    quorum_reads: int = 0
    _cache: LRUCache[tuple[str, str], Pod] = field(init=False)

    def __post_init__(self) -> None:
        self._cache = LRUCache(self.cache_size)

    def get(self, namespace: str, name: str, uid: str) -> Pod | None:
        """The pod, if it exists with this UID (any UID when `uid` is empty) and is bound
        to a node; None if it does not. Raises `errors.ApiError` when the API cannot tell."""
        key = (namespace, name)
        with self._lock:
            hit = self._cache.get(key)  # now the newest (an LRU)
            if hit is not None and uid and hit.uid == uid:
                self.cached_reads += 1
                return hit
        pod = self._read(namespace, name, quorum=False)
        if pod is None or (uid and pod.uid != uid) or not pod.node:
            pod = self._read(namespace, name, quorum=True)
        if pod is None or (uid and pod.uid != uid) or not pod.node:
            return None
        self._remember(pod)
        return pod

    def _read(self, namespace: str, name: str, *, quorum: bool) -> Pod | None:
        query = {} if quorum else {"resourceVersion": "0"}
        self.quorum_reads += quorum
        try:
            obj = self.rest.call(
                "GET", path("api", "v1", "namespaces", namespace, "pods", name), query=query
            )
        except errors.NotFoundError:
            return None
        return _facts(obj)

    def _remember(self, pod: Pod) -> None:
        with self._lock:
            self._cache[(pod.namespace, pod.name)] = pod

    def label(self, pod: Pod, value: str) -> None:
        """Set LABEL=value with a merge patch of that one label, unless it already is.

        The patch is conditional on the pod's UID, so a pod re-created under the same name
        is never labelled for its predecessor's failure."""
        if pod.label == value:
            return
        body = {"metadata": {"uid": pod.uid, "labels": {LABEL: value}}}
        self.rest.call(
            "PATCH",
            path("api", "v1", "namespaces", pod.namespace, "pods", pod.name),
            body=body,
            content_type=MERGE_PATCH,
        )
        self._remember(replace(pod, label=value))

    def forget(self, pod: Pod) -> None:
        with self._lock:
            self._cache.pop((pod.namespace, pod.name), None)
