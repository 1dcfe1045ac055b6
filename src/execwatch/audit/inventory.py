"""Read the cluster: workloads, their containers' images, the digests pods pulled, nodes.

Read-only: `list` on nodes, pods, replicasets, deployments, statefulsets, daemonsets, jobs
and cronjobs (docs/audit.md has the ClusterRole). Lists are paged.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from execwatch.kube.client import Rest, path

PAGE = 500
_DIGEST = re.compile(r"@(sha256:[a-f0-9]{64})$")

# kind -> (API group path, resource)
SOURCES = (
    ("Deployment", "apis/apps/v1", "deployments"),
    ("StatefulSet", "apis/apps/v1", "statefulsets"),
    ("DaemonSet", "apis/apps/v1", "daemonsets"),
    ("CronJob", "apis/batch/v1", "cronjobs"),
    ("Job", "apis/batch/v1", "jobs"),
)


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
class ClusterNode:
    name: str
    arch: str
    os: str


@dataclass
class Inventory:
    workloads: list[Workload]
    nodes: list[ClusterNode]


def read_cluster(rest: Rest, namespace: str | None = None) -> Inventory:
    """Every workload (of `namespace`, else of all) with its pods' digests, and the nodes.
    Failures are `kube.errors.ApiError`s."""
    workloads: dict[str, Workload] = {}
    job_owner: dict[tuple[str, str], str] = {}
    for kind, group, resource in SOURCES:
        for obj in _pages(rest, group, resource, namespace):
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
    for rs in _pages(rest, "apis/apps/v1", "replicasets", namespace):
        meta = rs.get("metadata") or {}
        owner = _controller(meta)
        if owner is not None and owner[0] == "Deployment":
            rs_owner[(meta.get("namespace", ""), meta.get("name", ""))] = owner[1]
    for pod in _pages(rest, "api/v1", "pods", namespace):
        _attach_pod(pod, workloads, rs_owner, job_owner)
    nodes = [_node(n) for n in _pages(rest, "api/v1", "nodes", None)]
    return Inventory(sorted(workloads.values(), key=lambda w: w.key), nodes)


def _pages(
    rest: Rest, group: str, resource: str, namespace: str | None
) -> Iterator[dict[str, Any]]:
    """Every object of `resource` (in `namespace`, else in all), a page at a time."""
    where = ("namespaces", namespace) if namespace else ()
    url = path(*group.split("/"), *where, resource)
    token: str | None = None
    while True:
        query: dict[str, str | int] = {"limit": PAGE}
        if token:
            query["continue"] = token
        doc = rest.call("GET", url, query=query)
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


def _node(node: dict[str, Any]) -> ClusterNode:
    meta, info = node.get("metadata") or {}, (node.get("status") or {}).get("nodeInfo") or {}
    labels = meta.get("labels") or {}
    arch = labels.get("kubernetes.io/arch") or info.get("architecture") or "unknown"
    os_name = labels.get("kubernetes.io/os") or info.get("operatingSystem") or "linux"
    return ClusterNode(str(meta.get("name", "")), str(arch), str(os_name))


def _repository(image: str) -> str:
    """`repo:tag`, `repo@digest` or `repo:tag@digest` -> `repo` (a registry port is kept)."""
    image = image.split("@", 1)[0]
    last = image.rsplit("/", 1)[-1]
    if ":" in last:
        image = image[: len(image) - len(last)] + last.split(":", 1)[0]
    return image
