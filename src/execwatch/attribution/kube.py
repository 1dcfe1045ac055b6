"""A PodSource fed by the Kubernetes API: this node's pods only, kept by list + watch.

The API knows what CRI does not: init and ephemeral containers by role, and owners.
ReplicaSet and Job owners are followed one step up (to the Deployment or CronJob) in
the watch thread, never on the event path. Deleted pods stay as tombstones for a
while, so a failure seen just before a pod's deletion still gets its names.

The API is lightkube's `Client` (`kube.kubeapi.client`), and the objects its models
(camelCase attributes: `metadata.ownerReferences`, `status.containerStatuses`).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from execwatch.attribution.metadata import (
    ContainerMeta,
    ContainerRole,
    PodMeta,
    WorkloadRef,
    workload_from_owner,
)

log = logging.getLogger(__name__)

STATUSES = (
    ("containerStatuses", ContainerRole.REGULAR),
    ("initContainerStatuses", ContainerRole.INIT),
    ("ephemeralContainerStatuses", ContainerRole.EPHEMERAL),
)


class KubernetesPodCache:
    """Thread-safe; ``pod()`` answers from memory. `api`: a lightkube Client (default:
    in-cluster, else the kubeconfig)."""

    def __init__(
        self,
        node_name: str,
        *,
        api: Any = None,
        tombstones: int = 4096,
        owner_cache: int = 4096,
        watch_timeout: int = 300,
        retry_delay: float = 5.0,
    ) -> None:
        self.node_name = node_name
        self._api = api
        self._tombstone_capacity = tombstones
        self._owner_capacity = owner_cache
        self._watch_timeout = watch_timeout
        self._retry_delay = retry_delay
        self._lock = threading.Lock()
        self._pods: dict[str, PodMeta] = {}
        self._tombstones: OrderedDict[str, PodMeta] = OrderedDict()
        self._owners: OrderedDict[tuple[str, str, str], WorkloadRef | None] = OrderedDict()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.synced = threading.Event()

    def start(self) -> None:
        if self._api is None:
            from execwatch.kube import kubeapi

            self._api = kubeapi.client()
        self._thread = threading.Thread(target=self._run, name="pod-cache", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
            self._thread = None

    def pod(self, uid: str) -> PodMeta | None:
        with self._lock:
            return self._pods.get(uid) or self._tombstones.get(uid)

    def _run(self) -> None:
        from lightkube.resources.core_v1 import Pod

        fields = {"spec.nodeName": self.node_name}
        while not self._stop.is_set():
            try:
                listing = self._api.list(Pod, namespace="*", fields=fields)
                self.replace(list(listing))
                self.synced.set()
                for kind, pod in self._api.watch(
                    Pod,
                    namespace="*",
                    fields=fields,
                    resource_version=listing.resourceVersion,
                    server_timeout=self._watch_timeout,
                ):
                    if self._stop.is_set():
                        return
                    self.apply(str(kind), pod)
            except Exception as exc:
                if self._stop.is_set():
                    return
                log.warning(
                    "pod watch failed; relisting", extra={"node": self.node_name, "error": str(exc)}
                )
                self._stop.wait(self._retry_delay)

    def replace(self, pods: Iterable[Any]) -> None:
        """A full listing: pods no longer listed become tombstones."""
        fresh = {meta.uid: meta for meta in (self._to_meta(p) for p in pods) if meta}
        with self._lock:
            for uid, old in self._pods.items():
                if uid not in fresh:
                    self._bury(old)
            self._pods = fresh

    def apply(self, event_type: str, pod: Any) -> None:
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
        self._tombstones.move_to_end(meta.uid)
        while len(self._tombstones) > self._tombstone_capacity:
            self._tombstones.popitem(last=False)

    def _to_meta(self, pod: Any) -> PodMeta | None:
        md = getattr(pod, "metadata", None)
        uid = getattr(md, "uid", None)
        if not uid:
            return None
        labels: dict[str, str] = dict(getattr(md, "labels", None) or {})
        namespace = getattr(md, "namespace", None)
        containers: dict[str, ContainerMeta] = {}
        status = getattr(pod, "status", None)
        for attr, role in STATUSES:
            for cs in getattr(status, attr, None) or []:
                cid = _strip_scheme(getattr(cs, "containerID", None))
                if cid:
                    containers[cid] = ContainerMeta(cid, cs.name, getattr(cs, "image", None), role)
        owner = _controller(getattr(md, "ownerReferences", None))
        workload = None
        if owner is not None:
            parents = self._parents(namespace, owner)
            workload = workload_from_owner(owner[0], owner[1], labels, parents)
        return PodMeta(
            uid=uid,
            namespace=namespace,
            name=getattr(md, "name", None),
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
        from lightkube.resources.apps_v1 import ReplicaSet
        from lightkube.resources.batch_v1 import Job

        try:
            obj = self._api.get(
                ReplicaSet if kind == "ReplicaSet" else Job, name, namespace=namespace
            )
        except Exception as exc:
            log.debug("owner lookup failed", extra={"kind": kind, "name": name, "error": str(exc)})
            return None
        parent = _controller(getattr(obj.metadata, "ownerReferences", None))
        workload = WorkloadRef(*parent) if parent else None
        with self._lock:
            self._owners[key] = workload
            while len(self._owners) > self._owner_capacity:
                self._owners.popitem(last=False)
        return {owner: workload}


def _controller(refs: Any) -> tuple[str, str] | None:
    for ref in refs or []:
        if getattr(ref, "controller", False):
            return str(ref.kind), str(ref.name)
    return None


def _strip_scheme(container_id: str | None) -> str | None:
    """``containerd://<id>`` / ``cri-o://<id>`` / ``docker://<id>`` -> ``<id>``."""
    if not container_id:
        return None
    return container_id.rpartition("://")[2] or None
