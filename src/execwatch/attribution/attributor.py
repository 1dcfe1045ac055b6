"""One entry point: the kernel's cgroup id (and pid) in, an Attribution out.

The order of trust: the cgroup path says which pod UID and container id (it is what the
kernel saw, even after the container is gone); the Kubernetes API cache and the CRI
runtime add names. A name source that contradicts the path is ignored, so a lookup
never yields a wrong pod. Runtime calls run under a time budget with a back-off, and
containers are looked up ahead of time when their cgroup appears, so that one that
dies and is deleted at once still gets its names.
"""

from __future__ import annotations

import logging
import os
import posixpath
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from cachetools import LRUCache, TTLCache

from execwatch.attribution.cgroup_inventory import CgroupInventory
from execwatch.attribution.cgroup_layout import CgroupKind, CgroupLayout, parse_cgroup_path
from execwatch.attribution.cri.client import CriContainers
from execwatch.attribution.engine_api import Layers
from execwatch.attribution.engines import Engines, Named
from execwatch.attribution.metadata import (
    ContainerSource,
    CriContainer,
    CriUnavailable,
    PodMeta,
    PodSource,
    WorkloadRef,
    workload_from_labels,
)
from execwatch.attribution.mounts import CgroupMounts, cgroup_mounts
from execwatch.attribution.prefetch import DelayQueue
from execwatch.attribution.procfs import read_proc_cgroup
from execwatch.record import Attribution, AttributionStatus

log = logging.getLogger(__name__)

PREFETCH_RETRY_DELAYS = (0.2, 1.0)


@dataclass(frozen=True, slots=True)
class AttributorConfig:
    budget: float = 0.25  # most resolve() may wait for the runtime, in seconds
    # Most resolve() waits for a Docker/Podman engine's inspect of a container it is
    # starting: an engine answers slower than CRI under load, and stays under the pipeline's
    # 1 s attribution watchdog (pipeline.executor.DIAGNOSIS_BUDGET_S).
    engine_budget: float = 0.75
    backoff: float = 5.0  # after the runtime failed to answer, skip it this long
    cache_size: int = 8192  # containers whose runtime metadata is kept
    negative_ttl: float = 2.0  # "runtime does not know this id" is retried after this
    prefetch: bool = True  # ask the runtime as soon as a container's cgroup appears
    prefetch_timeout: float = 2.0
    prefetch_queue: int = 1024
    rescan_interval: float = 60.0
    recent_cgroups: int = 16384  # deleted cgroups remembered for late lookups
    kubelet_cgroup_root: str | None = None  # the kubelet's --cgroup-root; None: from the path


class Attributor:
    """Thread-safe. ``start()`` scans the cgroup tree and starts the watchers."""

    def __init__(
        self,
        *,
        config: AttributorConfig | None = None,
        mounts: CgroupMounts | None = None,
        containers: ContainerSource | None = None,
        pods: PodSource | None = None,
        engines: Engines | None = None,
        proc: Path = Path("/proc"),
    ) -> None:
        self.config = config or AttributorConfig()
        self._mounts = mounts
        self._containers = containers
        self._pods = pods
        self._engines = engines
        self._proc = proc
        self.inventory: CgroupInventory | None = None
        self._lock = threading.Lock()
        self._cache: LRUCache[str, CriContainer] = LRUCache(self.config.cache_size)
        # container ids the runtime did not know: not asked again for negative_ttl
        self._unknown: TTLCache[str, None] = TTLCache(
            self.config.cache_size, self.config.negative_ttl, timer=time.monotonic
        )
        self._runtime_down_until = 0.0
        self._prefetch = DelayQueue(self.config.prefetch_queue)
        self._prefetch_thread: threading.Thread | None = None
        self._started = False

    def start(self) -> None:
        if self._started:
            return
        mounts = self._mounts if self._mounts is not None else cgroup_mounts()
        self._mounts = mounts
        if self._containers is None:
            self._containers = CriContainers()
        if self._engines is None:
            self._engines = Engines()
        self._engines.start()
        if mounts.unified is not None:
            hook = self._on_new_cgroup if self.config.prefetch else None
            self.inventory = CgroupInventory(
                mounts.unified,
                recent_capacity=self.config.recent_cgroups,
                rescan_interval=self.config.rescan_interval,
                on_new_cgroup=hook,
            )
        if self.config.prefetch:
            self._prefetch_thread = threading.Thread(
                target=self._prefetch_loop, name="attribution-prefetch", daemon=True
            )
            self._prefetch_thread.start()
        if self.inventory is not None:
            self.inventory.start()
        else:
            log.warning("no cgroup2 hierarchy mounted: attribution needs live pids")
        if self._pods is not None:
            self._pods.start()
        self._started = True

    def close(self) -> None:
        self._prefetch.close()
        if self._prefetch_thread is not None:
            self._prefetch_thread.join(timeout=5)
            self._prefetch_thread = None
        if self.inventory is not None:
            self.inventory.close()
        if self._pods is not None:
            self._pods.close()
        if self._containers is not None:
            self._containers.close()
        if self._engines is not None:
            self._engines.close()
        self._started = False

    def __enter__(self) -> Attributor:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def cgroup_alive(self, cgroup_id: int) -> bool:
        """False once the inventory knows the cgroup is removed (or cannot find it at all),
        so the kernel's per-cgroup counts of it can go; True when there is no inventory."""
        if self.inventory is None:
            return True
        entry = self.inventory.lookup(cgroup_id)
        return entry is not None and entry.alive

    def container_id(
        self, cgroup_id: int, pid: int | None = None, *, name: str = "", parent_id: int = 0
    ) -> str | None:
        """The container id the cgroup path names, without asking any runtime: fast enough
        to find a dying container's rootfs before the runtime unmounts it."""
        layout = self._layout(cgroup_id, pid, name, parent_id)
        return layout.container_id if layout is not None else None

    def resolve(
        self, cgroup_id: int, pid: int | None = None, *, name: str = "", parent_id: int = 0
    ) -> Attribution:
        """Attribute one failed exec. Waits for the runtime at most ``config.budget``.

        `name` and `parent_id` are the cgroup's own name and its parent's id as the probe
        saw them: they rebuild the path of a cgroup that came and went unlisted."""
        layout = self._layout(cgroup_id, pid, name, parent_id)
        if layout is None:
            return Attribution(AttributionStatus.UNATTRIBUTED)
        if layout.kind is CgroupKind.HOST:
            return Attribution(AttributionStatus.HOST, cgroup_path=layout.path)
        if layout.kind is CgroupKind.CONTAINER:
            return self._engine_container(layout)
        if layout.kind is CgroupKind.UNKNOWN:
            return Attribution(AttributionStatus.UNATTRIBUTED, cgroup_path=layout.path)
        return self._kubernetes(layout)

    def engine_layers(
        self, cgroup_id: int, pid: int | None = None, *, name: str = "", parent_id: int = 0
    ) -> tuple[str, Layers] | None:
        """(container id, its graph driver's directories) of a Docker or Podman container,
        from memory: the root of a container already gone, for the diagnosis."""
        layout = self._layout(cgroup_id, pid, name, parent_id)
        if layout is None or layout.kind is not CgroupKind.CONTAINER or not layout.container_id:
            return None
        named = self._engine_named(layout, wait=0.0)
        if named is None or named.container.layers is None:
            return None
        return layout.container_id, named.container.layers

    def _engine_named(self, layout: CgroupLayout, wait: float) -> Named | None:
        """An engine reports a container it starts a moment after its cgroup appears:
        waited for at most `wait` (the engine budget), never while the engine is down."""
        if self._engines is None or not layout.container_id:
            return None
        return self._engines.lookup(
            layout.runtime, layout.container_id, layout.owner_uid, wait=wait
        )

    def _engine_container(self, layout: CgroupLayout) -> Attribution:
        """A container outside Kubernetes: `host`, named by its engine when it knows it."""
        named = self._engine_named(layout, wait=self.config.engine_budget)
        found = named.container if named is not None else None
        return Attribution(
            AttributionStatus.HOST,
            cgroup_path=layout.path,
            runtime=layout.runtime,
            container_id=layout.container_id,
            container=found.name if found else None,
            image=found.image if found else None,
            image_id=found.image_id if found else None,
            compose_project=found.compose_project if found else None,
            compose_service=found.compose_service if found else None,
            engine_user=named.user if named else None,
            engine_pod=found.pod_name if found else None,
        )

    def has_names_for(self, container_id: str) -> bool:
        """Whether the runtime's metadata for this container is already held (diagnostics)."""
        with self._lock:
            return container_id in self._cache

    def _layout(
        self, cgroup_id: int, pid: int | None, name: str = "", parent_id: int = 0
    ) -> CgroupLayout | None:
        entry = self.inventory.lookup(cgroup_id) if self.inventory is not None else None
        path = entry.path if entry is not None else self._path_under_parent(parent_id, name)
        layout = (
            parse_cgroup_path(path, self.config.kubelet_cgroup_root) if path is not None else None
        )
        informative = layout is not None and layout.kind in (
            CgroupKind.KUBERNETES,
            CgroupKind.CONTAINER,
        )
        if pid is not None and not informative:
            from_proc = self._layout_from_proc(pid, cgroup_id, entry.path if entry else None)
            if from_proc is not None:
                return from_proc
        return layout

    def _path_under_parent(self, parent_id: int, name: str) -> str | None:
        """A pod's cgroup outlives its containers', so the parent is known even when a
        container's own cgroup was created and removed between two inventory updates."""
        if not parent_id or not name or "/" in name or self.inventory is None:
            return None
        parent = self.inventory.lookup(parent_id)
        return posixpath.join(parent.path, name) if parent is not None else None

    def _layout_from_proc(
        self, pid: int, cgroup_id: int, v2_path: str | None
    ) -> CgroupLayout | None:
        """The task's v1 paths, if it is still the task the kernel reported."""
        cgroups = read_proc_cgroup(pid, self._proc)
        if cgroups is None:
            return None
        if not self._same_v2_cgroup(cgroups.unified, cgroup_id, v2_path):
            log.debug(
                "pid left its cgroup or was reused", extra={"pid": pid, "cgroup_id": cgroup_id}
            )
            return None
        for path in cgroups.v1_paths():
            layout = parse_cgroup_path(path, self.config.kubelet_cgroup_root)
            if layout.kind in (CgroupKind.KUBERNETES, CgroupKind.CONTAINER):
                return layout
        return None

    def _same_v2_cgroup(self, proc_path: str | None, cgroup_id: int, v2_path: str | None) -> bool:
        if v2_path is not None:
            return proc_path == v2_path
        unified = self._mounts.unified if self._mounts is not None else None
        if unified is None or proc_path is None:
            return True  # pure v1: the id names nothing, the live pid is all there is
        fs_path = unified.to_fs_path(proc_path)
        try:
            return fs_path is not None and os.stat(fs_path).st_ino == cgroup_id
        except OSError:
            return False

    def _kubernetes(self, layout: CgroupLayout) -> Attribution:
        uid, cid = layout.pod_uid, layout.container_id
        pod = self._pod(uid) if uid else None
        cri = self._container(cid) if cid else None
        if cri is not None and cri.pod_uid and uid and cri.pod_uid != uid:
            log.warning(
                "runtime names another pod than the cgroup path; ignoring the runtime",
                extra={"container_id": cid, "path_pod_uid": uid, "runtime_pod_uid": cri.pod_uid},
            )
            cri = None
        known = pod.containers.get(cid) if pod is not None and cid else None
        namespace = (pod.namespace if pod else None) or (cri.namespace if cri else None)
        pod_name = (pod.name if pod else None) or (cri.pod_name if cri else None)
        container = (known.name if known else None) or (cri.name if cri else None)
        image = (cri.image if cri else None) or (known.image if known else None)
        workload = self._workload(pod, cri, pod_name)
        complete = namespace and pod_name and container
        return Attribution(
            status=AttributionStatus.ATTRIBUTED if complete else AttributionStatus.PARTIAL,
            cgroup_path=layout.path,
            runtime=layout.runtime or (cri.runtime if cri else None),
            container_id=cid,
            pod_uid=uid,
            namespace=namespace,
            pod=pod_name,
            container=container,
            image=image,
            workload_kind=workload.kind if workload else None,
            workload=workload.name if workload else None,
        )

    @staticmethod
    def _workload(
        pod: PodMeta | None, cri: CriContainer | None, pod_name: str | None
    ) -> WorkloadRef | None:
        if pod is not None and pod.workload is not None:
            return pod.workload
        labels = pod.labels if pod is not None and pod.labels else (cri.pod_labels if cri else {})
        return workload_from_labels(pod_name, labels)

    def _pod(self, uid: str) -> PodMeta | None:
        if self._pods is None:
            return None
        try:
            return self._pods.pod(uid)
        except Exception:
            log.exception("pod source failed", extra={"pod_uid": uid})
            return None

    def _container(self, container_id: str) -> CriContainer | None:
        """Runtime metadata, from the cache or within the budget; None if unknown now."""
        now = time.monotonic()
        with self._lock:
            cached = self._cache.get(container_id)  # an LRU hit: now the newest
            if cached is not None:
                return cached
            if container_id in self._unknown or self._runtime_down_until > now:
                return None
        return self._ask_runtime(container_id, self.config.budget)

    def _ask_runtime(
        self, container_id: str, timeout: float, *, remember_unknown: bool = True
    ) -> CriContainer | None:
        if self._containers is None:
            return None
        try:
            found = self._containers.container(container_id, timeout)
        except CriUnavailable as exc:
            with self._lock:
                self._runtime_down_until = time.monotonic() + self.config.backoff
            log.warning(
                "container runtime did not answer",
                extra={"container_id": container_id, "error": str(exc)},
            )
            return None
        with self._lock:
            if found is None:
                if not remember_unknown:
                    return None
                self._unknown[container_id] = None
                return None
            self._unknown.pop(container_id, None)
            self._cache[container_id] = found
        return found

    def _on_new_cgroup(self, _cgroup_id: int, path: str) -> None:
        """Runs on the inventory thread: never block it, just queue the id."""
        layout = parse_cgroup_path(path, self.config.kubelet_cgroup_root)
        cid = layout.container_id
        if layout.kind is CgroupKind.KUBERNETES and cid and not self._prefetch.put(cid):
            log.debug("prefetch queue full", extra={"container_id": cid})

    def _prefetch_loop(self) -> None:
        while (item := self._prefetch.get()) is not None:
            with self._lock:
                if item.container_id in self._cache or self._runtime_down_until > time.monotonic():
                    continue
            found = self._ask_runtime(
                item.container_id, self.config.prefetch_timeout, remember_unknown=False
            )
            if found is None and item.attempt < len(PREFETCH_RETRY_DELAYS):
                # The runtime may record the container a moment after its cgroup appears.
                delay = PREFETCH_RETRY_DELAYS[item.attempt]
                self._prefetch.put(item.container_id, item.attempt + 1, delay)
