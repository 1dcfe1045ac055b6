"""A PodSource fed by the Kubernetes API: this node's pods only, kept by list + watch.

The API knows what CRI does not: init and ephemeral containers by role, and owners.
ReplicaSet and Job owners are followed one step up (to the Deployment or CronJob) in
the watch thread, never on the event path. Deleted pods stay as tombstones for a
while, so a failure seen just before a pod's deletion still gets its names.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from execwatch.attribution.metadata import (
    ContainerMeta,
    ContainerRole,
    PodMeta,
    Workload,
    workload_from_owner,
)

log = logging.getLogger(__name__)

WatchStream = Callable[..., Iterator[dict[str, Any]]]


class KubernetesPodCache:
    """Thread-safe; ``pod()`` answers from memory. Pass API objects to test or to share."""

    def __init__(
        self,
        node_name: str,
        *,
        core_api: Any = None,
        apps_api: Any = None,
        batch_api: Any = None,
        watch_stream: WatchStream | None = None,
        tombstones: int = 4096,
        owner_cache: int = 4096,
        watch_timeout: int = 300,
        retry_delay: float = 5.0,
    ) -> None:
        self.node_name = node_name
        self._core, self._apps, self._batch = core_api, apps_api, batch_api
        self._watch_stream = watch_stream
        self._tombstone_capacity = tombstones
        self._owner_capacity = owner_cache
        self._watch_timeout = watch_timeout
        self._retry_delay = retry_delay
        self._lock = threading.Lock()
        self._pods: dict[str, PodMeta] = {}
        self._tombstones: OrderedDict[str, PodMeta] = OrderedDict()
        self._owners: OrderedDict[tuple[str, str, str], Workload | None] = OrderedDict()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.synced = threading.Event()

    def start(self) -> None:
        if self._core is None:
            self._connect()
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

    def _connect(self) -> None:
        from kubernetes import client, config, watch

        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        self._core = client.CoreV1Api()
        self._apps = client.AppsV1Api()
        self._batch = client.BatchV1Api()
        self._watch_stream = watch.Watch().stream

    def _run(self) -> None:
        selector = f"spec.nodeName={self.node_name}"
        while not self._stop.is_set():
            try:
                listing = self._core.list_pod_for_all_namespaces(field_selector=selector)
                self.replace(listing.items)
                self.synced.set()
                version = listing.metadata.resource_version
                assert self._watch_stream is not None
                for event in self._watch_stream(
                    self._core.list_pod_for_all_namespaces,
                    field_selector=selector,
                    resource_version=version,
                    timeout_seconds=self._watch_timeout,
                ):
                    if self._stop.is_set():
                        return
                    self.apply(str(event.get("type")), event.get("object"))
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
        for attr, role in (
            ("container_statuses", ContainerRole.REGULAR),
            ("init_container_statuses", ContainerRole.INIT),
            ("ephemeral_container_statuses", ContainerRole.EPHEMERAL),
        ):
            for cs in getattr(status, attr, None) or []:
                cid = _strip_scheme(getattr(cs, "container_id", None))
                if cid:
                    containers[cid] = ContainerMeta(cid, cs.name, getattr(cs, "image", None), role)
        owner = _controller(getattr(md, "owner_references", None))
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
    ) -> dict[tuple[str, str], Workload | None] | None:
        """The ReplicaSet's or Job's own controller, from the API, cached; None if unknown."""
        kind, name = owner
        if kind not in ("ReplicaSet", "Job") or not namespace:
            return None
        key = (namespace, kind, name)
        with self._lock:
            if key in self._owners:
                return {owner: self._owners[key]}
        api, read = (
            (self._apps, "read_namespaced_replica_set")
            if kind == "ReplicaSet"
            else (self._batch, "read_namespaced_job")
        )
        if api is None:
            return None
        try:
            obj = getattr(api, read)(name, namespace)
        except Exception as exc:
            log.debug("owner lookup failed", extra={"kind": kind, "name": name, "error": str(exc)})
            return None
        parent = _controller(getattr(obj.metadata, "owner_references", None))
        workload = Workload(*parent) if parent else None
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
