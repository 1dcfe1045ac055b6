"""What execwatch knows about pods and containers, whichever source it came from.

Two sources feed it: the node's CRI runtime (always there on a node, knows exited
containers until the kubelet removes them) and, optionally, a Kubernetes API watch
cache (knows owners, keeps pods a while after deletion). ``PodSource`` is the seam
where the cluster pipeline plugs its cache in.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol


class ContainerRole(enum.StrEnum):
    REGULAR = "regular"
    INIT = "init"
    EPHEMERAL = "ephemeral"
    SANDBOX = "sandbox"  # the pause container holding the pod's namespaces


SANDBOX_CONTAINER_NAME = "POD"  # what the kubelet and cAdvisor call the pause container

# Labels the kubelet puts on every CRI container and sandbox.
LABEL_POD_NAME = "io.kubernetes.pod.name"
LABEL_POD_NAMESPACE = "io.kubernetes.pod.namespace"
LABEL_POD_UID = "io.kubernetes.pod.uid"
LABEL_CONTAINER_NAME = "io.kubernetes.container.name"


@dataclass(frozen=True, slots=True)
class ContainerMeta:
    container_id: str
    name: str | None = None
    image: str | None = None
    role: ContainerRole = ContainerRole.REGULAR


@dataclass(frozen=True, slots=True)
class WorkloadRef:
    kind: str
    name: str


@dataclass(frozen=True, slots=True)
class PodMeta:
    uid: str
    namespace: str | None = None
    name: str | None = None
    workload: WorkloadRef | None = None
    containers: Mapping[str, ContainerMeta] = field(default_factory=dict)  # by container id
    labels: Mapping[str, str] = field(default_factory=dict)
    deleted: bool = False  # seen deleted by the API: names still valid, pod gone


@dataclass(frozen=True, slots=True)
class CriContainer:
    """One container (or sandbox) as the CRI runtime describes it."""

    container_id: str
    pod_uid: str | None
    pod_name: str | None
    namespace: str | None
    name: str | None
    image: str | None
    role: ContainerRole
    runtime: str | None
    pod_labels: Mapping[str, str] = field(default_factory=dict)


class PodSource(Protocol):
    """Pods of this node by UID: implemented by the Kubernetes API cache, or by a test."""

    def start(self) -> None: ...

    def close(self) -> None: ...

    def pod(self, uid: str) -> PodMeta | None:
        """Must answer from memory: it runs on the event path."""
        ...


class ContainerSource(Protocol):
    """Containers by id, from the node's CRI runtime."""

    def container(self, container_id: str, timeout: float) -> CriContainer | None:
        """None if the runtime does not know the id; raises CriUnavailable if it cannot say."""
        ...

    def close(self) -> None: ...


class CriUnavailable(Exception):
    """The runtime did not answer in time or at all: unknown, not absent."""


_HASH_SUFFIX = re.compile(r"^[a-z0-9]{5}$")
_ORDINAL = re.compile(r"^(?P<set>.+)-(?P<ordinal>\d+)$")


def workload_from_labels(pod_name: str | None, labels: Mapping[str, str]) -> WorkloadRef | None:
    """The owning workload as the controllers' own labels and naming rules reveal it.

    Used only when no API owner is known. Each rule needs a controller-set label, so a
    bare pod gets None rather than a guess from its name. CronJobs cannot be told from
    labels, so their pods report the Job.
    """
    if not pod_name:
        return None
    template_hash = labels.get("pod-template-hash")
    if template_hash:
        prefix, sep, suffix = pod_name.rpartition("-")
        if sep and _HASH_SUFFIX.match(suffix) and prefix.endswith("-" + template_hash):
            return WorkloadRef("Deployment", prefix[: -len(template_hash) - 1])
        return None
    if "controller-revision-hash" in labels:
        if labels.get("statefulset.kubernetes.io/pod-name") == pod_name:
            m = _ORDINAL.match(pod_name)
            return WorkloadRef("StatefulSet", m["set"]) if m else None
        if "pod-template-generation" in labels:
            prefix, sep, suffix = pod_name.rpartition("-")
            if sep and _HASH_SUFFIX.match(suffix):
                return WorkloadRef("DaemonSet", prefix)
        return None
    job = labels.get("batch.kubernetes.io/job-name") or labels.get("job-name")
    if job:
        return WorkloadRef("Job", job)
    return None


def workload_from_owner(
    owner_kind: str | None,
    owner_name: str | None,
    labels: Mapping[str, str],
    parent_of: Mapping[tuple[str, str], WorkloadRef | None] | None = None,
) -> WorkloadRef | None:
    """The top-level workload from a pod's controller owner reference.

    ``parent_of`` maps (kind, name) of a ReplicaSet or Job to its own controller, as the
    API said; without it a ReplicaSet named ``<deployment>-<pod-template-hash>`` is taken
    to be its Deployment's, which is how the Deployment controller names them.
    """
    if not owner_kind or not owner_name:
        return None
    if owner_kind in ("ReplicaSet", "Job") and parent_of is not None:
        key = (owner_kind, owner_name)
        if key in parent_of:
            return parent_of[key] or WorkloadRef(owner_kind, owner_name)
    if owner_kind == "ReplicaSet":
        template_hash = labels.get("pod-template-hash")
        if template_hash and owner_name.endswith("-" + template_hash):
            return WorkloadRef("Deployment", owner_name[: -len(template_hash) - 1])
    return WorkloadRef(owner_kind, owner_name)
