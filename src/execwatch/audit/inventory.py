"""Read the cluster: workloads, their containers' images, the digests pods pulled, nodes.

Read-only: `list` on nodes, pods, replicasets, deployments, statefulsets, daemonsets, jobs
and cronjobs (docs/audit.md has the ClusterRole). Lists are paged.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

PAGE = 500
_DIGEST = re.compile(r"@(sha256:[a-f0-9]{64})$")

# kind -> (list call, path of the pod template's spec in the object)
Lister = Callable[..., Any]


@dataclass
class Container:
    name: str
    image: str
    init: bool = False
    pulled: set[str] = field(default_factory=set)  # digests the kubelet reported (imageID)

    @property
    def references(self) -> list[str]:
        """What to scan: the image as pulled (repository@digest) where pods run, else as written."""
        if not self.pulled:
            return [self.image]
        repository = _repository(self.image)
        return [f"{repository}@{d}" for d in sorted(self.pulled)]


@dataclass
class Workload:
    kind: str
    namespace: str
    name: str
    pod_spec: dict[str, Any]
    containers: list[Container]

    @property
    def key(self) -> str:
        return f"{self.kind}/{self.namespace}/{self.name}"


@dataclass
class Node:
    name: str
    arch: str
    os: str


@dataclass
class Inventory:
    workloads: list[Workload]
    nodes: list[Node]


def read_cluster(api: Any, namespace: str | None = None) -> Inventory:
    """`api`: a kubernetes.client.ApiClient (imported here, not with the package: the
    node agent imports execwatch.cli too and must not load the 58 MB client)."""
    from kubernetes import client

    apps, batch, core = client.AppsV1Api(api), client.BatchV1Api(api), client.CoreV1Api(api)

    def listing(all_ns: Lister, one_ns: Lister) -> Iterator[dict[str, Any]]:
        if namespace is None:
            return _pages(all_ns)
        return _pages(one_ns, namespace)

    workloads: dict[str, Workload] = {}
    sources = [
        (kind, listing(getattr(api_, f"list_{name}_for_all_namespaces"),
                       getattr(api_, f"list_namespaced_{name}")))
        for kind, api_, name in (
            ("Deployment", apps, "deployment"),
            ("StatefulSet", apps, "stateful_set"),
            ("DaemonSet", apps, "daemon_set"),
            ("CronJob", batch, "cron_job"),
            ("Job", batch, "job"),
        )
    ]  # fmt: skip
    job_owner: dict[tuple[str, str], str] = {}
    for kind, items in sources:
        for obj in items:
            meta = obj.get("metadata") or {}
            owner = _controller(meta)
            if kind == "Job" and owner is not None and owner[0] == "CronJob":
                job_owner[(meta.get("namespace", ""), meta.get("name", ""))] = owner[1]
                continue  # a CronJob's run: audited through its CronJob
            template = _template(kind, obj)
            if template is not None:
                w = _workload(kind, meta, template)
                workloads[w.key] = w
    rs_owner: dict[tuple[str, str], str] = {}
    for rs in listing(apps.list_replica_set_for_all_namespaces, apps.list_namespaced_replica_set):
        meta = rs.get("metadata") or {}
        owner = _controller(meta)
        if owner is not None and owner[0] == "Deployment":
            rs_owner[(meta.get("namespace", ""), meta.get("name", ""))] = owner[1]
    for pod in listing(core.list_pod_for_all_namespaces, core.list_namespaced_pod):
        _attach_pod(pod, workloads, rs_owner, job_owner)
    nodes = [_node(n) for n in _pages(core.list_node)]
    return Inventory(sorted(workloads.values(), key=lambda w: w.key), nodes)


def _pages(call: Lister, *args: str) -> Iterator[dict[str, Any]]:
    token: str | None = None
    while True:
        kwargs: dict[str, Any] = {"limit": PAGE, "_preload_content": False}
        if token:
            kwargs["_continue"] = token
        doc = json.loads(call(*args, **kwargs).data)
        yield from doc.get("items") or []
        token = (doc.get("metadata") or {}).get("continue")
        if not token:
            return


def _controller(meta: dict[str, Any]) -> tuple[str, str] | None:
    for ref in meta.get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("kind")), str(ref.get("name"))
    return None


def _template(kind: str, obj: dict[str, Any]) -> dict[str, Any] | None:
    spec = obj.get("spec") or {}
    if kind == "CronJob":
        spec = (spec.get("jobTemplate") or {}).get("spec") or {}
    template = (spec.get("template") or {}).get("spec")
    return template if isinstance(template, dict) else None


def _workload(kind: str, meta: dict[str, Any], pod_spec: dict[str, Any]) -> Workload:
    containers = [
        Container(str(c.get("name")), str(c.get("image")), init=init)
        for init, key in ((True, "initContainers"), (False, "containers"))
        for c in pod_spec.get(key) or []
        if isinstance(c, dict) and c.get("image")
    ]
    return Workload(kind, str(meta.get("namespace", "")), str(meta.get("name", "")), pod_spec,
                    containers)  # fmt: skip


def _attach_pod(
    pod: dict[str, Any],
    workloads: dict[str, Workload],
    rs_owner: dict[tuple[str, str], str],
    job_owner: dict[tuple[str, str], str],
) -> None:
    """Record the digests this pod's containers run; a pod nobody owns is a workload itself."""
    meta = pod.get("metadata") or {}
    ns = str(meta.get("namespace", ""))
    owner = _controller(meta)
    if owner is None:
        w = _workload("Pod", meta, pod.get("spec") or {})
        workloads[w.key] = w
    else:
        kind, name = owner
        if kind == "ReplicaSet" and (ns, name) in rs_owner:
            kind, name = "Deployment", rs_owner[(ns, name)]
        elif kind == "Job" and (ns, name) in job_owner:
            kind, name = "CronJob", job_owner[(ns, name)]
        w = workloads.get(f"{kind}/{ns}/{name}")  # type: ignore[assignment]
        if w is None:
            return
    status = pod.get("status") or {}
    pulled: dict[str, str] = {}
    for key in ("initContainerStatuses", "containerStatuses"):
        for cs in status.get(key) or []:
            m = _DIGEST.search(str(cs.get("imageID", "")))
            if m:
                pulled[str(cs.get("name"))] = m.group(1)
    for c in w.containers:
        if c.name in pulled:
            c.pulled.add(pulled[c.name])


def _node(node: dict[str, Any]) -> Node:
    meta, info = node.get("metadata") or {}, (node.get("status") or {}).get("nodeInfo") or {}
    labels = meta.get("labels") or {}
    arch = labels.get("kubernetes.io/arch") or info.get("architecture") or "unknown"
    os_name = labels.get("kubernetes.io/os") or info.get("operatingSystem") or "linux"
    return Node(str(meta.get("name", "")), str(arch), str(os_name))


def _repository(image: str) -> str:
    """`repo:tag`, `repo@digest` or `repo:tag@digest` -> `repo` (a registry port is kept)."""
    image = image.split("@", 1)[0]
    last = image.rsplit("/", 1)[-1]
    if ":" in last:
        image = image[: len(image) - len(last)] + last.split(":", 1)[0]
    return image
