"""Read a cgroup path the way the kubelet and the container runtimes wrote it.

A pure function: no file system, no runtime socket. What it cannot recognise with
certainty comes back as ``CgroupKind.UNKNOWN`` with the raw path, because a wrong
pod is worse than no pod for an administrator who will go and look at it.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass


class CgroupKind(enum.StrEnum):
    KUBERNETES = "kubernetes"  # under the kubelet's kubepods hierarchy
    CONTAINER = "container"  # a container outside Kubernetes (podman, docker)
    HOST = "host"  # the root cgroup, a systemd service, slice or session
    UNKNOWN = "unknown"


class QosClass(enum.StrEnum):
    GUARANTEED = "guaranteed"
    BURSTABLE = "burstable"
    BESTEFFORT = "besteffort"


class CgroupDriver(enum.StrEnum):
    SYSTEMD = "systemd"
    CGROUPFS = "cgroupfs"


# cgroup-name prefix -> runtime, longest first so that crio-conmon wins over crio.
RUNTIME_PREFIXES: tuple[tuple[str, str], ...] = (
    ("cri-containerd", "containerd"),
    ("crio-conmon", "cri-o"),
    ("crio", "cri-o"),
    ("docker", "docker"),
    ("libpod-conmon", "podman"),
    ("libpod", "podman"),
)

_HEX64 = r"[0-9a-f]{64}"
_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
_HASH32 = r"[0-9a-f]{32}"  # static pods: the UID is a hash of the manifest
_QOS = r"(?P<qos>burstable|besteffort)"
_PREFIX = "|".join(re.escape(p) for p, _ in RUNTIME_PREFIXES)

_SYSTEMD_KUBEPODS = re.compile(r"^(?P<root>(?:[a-z0-9_]+-)*)kubepods\.slice$")
_SYSTEMD_QOS = re.compile(rf"^(?P<root>(?:[a-z0-9_]+-)*)kubepods-{_QOS}\.slice$")
_SYSTEMD_POD = re.compile(
    rf"^(?P<root>(?:[a-z0-9_]+-)*)kubepods(?:-{_QOS})?-pod(?P<uid>[0-9a-f_]+)\.slice$"
)
_SYSTEMD_SCOPE = re.compile(rf"^(?P<prefix>{_PREFIX})-(?P<id>{_HEX64})\.scope$")
_CGROUPFS_POD = re.compile(r"^pod(?P<uid>[0-9a-f-]+)$")
_CGROUPFS_CONTAINER = re.compile(rf"^(?:(?P<prefix>{_PREFIX})-)?(?P<id>{_HEX64})(?:\.scope)?$")
_UID = re.compile(rf"^(?:{_UUID}|{_HASH32})$")
_POD_ID = re.compile(rf"^{_HEX64}$")
_SERVICE = re.compile(r"^[A-Za-z0-9:_.\\@-]+\.(?:service|scope|slice)$")
_USER_SERVICE = re.compile(r"^user@(?P<uid>[0-9]{1,10})\.service$")
_MAX_PATH = 4096


@dataclass(frozen=True, slots=True)
class CgroupLayout:
    """What a cgroup path says about its owner. ``path`` is always the raw input."""

    kind: CgroupKind
    path: str
    driver: CgroupDriver | None = None
    qos: QosClass | None = None
    pod_uid: str | None = None
    runtime: str | None = None  # "containerd", "cri-o", "docker", "podman"; None if unsaid
    container_id: str | None = None
    monitor: bool = False  # crio-conmon / libpod-conmon: the runtime's monitor process
    unit: str | None = None  # innermost systemd unit, for host processes
    owner_uid: int | None = None  # a container in user@UID.service: a rootless engine's


def parse_cgroup_path(path: str, kubelet_root: str | None = None) -> CgroupLayout:
    """Classify a cgroup path relative to its hierarchy root (``/`` is the root cgroup).

    The kubepods hierarchy counts only where the kubelet puts it, at its cgroup root
    (`kubelet_root`, its --cgroup-root). Left None, the root is read from the path: a
    systemd ``a-b-kubepods.slice`` must sit exactly at ``/a.slice/a-b.slice``, and a
    cgroupfs ``kubepods`` under no systemd unit. A "kubepods" anywhere else (a user's
    delegated cgroup tree, under ``user@UID.service``) is UNKNOWN, never a pod."""
    if not isinstance(path, str) or len(path) > _MAX_PATH or "\x00" in path:
        return CgroupLayout(CgroupKind.UNKNOWN, str(path)[:_MAX_PATH])
    parts = path.strip("/").split("/") if path.strip("/") else []
    if any(p in ("", ".", "..") or p != p.strip() for p in parts):
        return CgroupLayout(CgroupKind.UNKNOWN, path)
    if not parts:
        return CgroupLayout(CgroupKind.HOST, path)
    for index, part in enumerate(parts):
        if m := _SYSTEMD_KUBEPODS.match(part):
            if not _systemd_anchored(parts[:index], m["root"], kubelet_root):
                return CgroupLayout(CgroupKind.UNKNOWN, path)
            return _systemd_kubepods(path, parts[index + 1 :], m["root"])
        if part == "kubepods":
            if not _cgroupfs_anchored(parts[:index], kubelet_root):
                return CgroupLayout(CgroupKind.UNKNOWN, path)
            return _cgroupfs_kubepods(path, parts[index + 1 :])
    return _outside_kubernetes(path, parts)


def _root_names(kubelet_root: str) -> list[str]:
    return [p for p in kubelet_root.strip("/").split("/") if p]


def _systemd_anchored(ancestors: list[str], prefix: str, kubelet_root: str | None) -> bool:
    """systemd names a slice after all its ancestors: a-b-kubepods.slice lives at
    /a.slice/a-b.slice and nowhere else."""
    names = prefix.rstrip("-").split("-") if prefix else []
    expected = [f"{'-'.join(names[: i + 1])}.slice" for i in range(len(names))]
    if ancestors != expected:
        return False
    if kubelet_root is None:
        return True
    root = [n.removesuffix(".slice").split("-")[-1] for n in _root_names(kubelet_root)]
    return names == root


def _cgroupfs_anchored(ancestors: list[str], kubelet_root: str | None) -> bool:
    if kubelet_root is not None:
        return ancestors == _root_names(kubelet_root)
    return not any(_SERVICE.match(p) for p in ancestors)


def _systemd_kubepods(path: str, rest: list[str], root: str) -> CgroupLayout:
    """kubepods.slice/[kubepods-<qos>.slice/]kubepods[-<qos>]-pod<uid_>.slice/<rt>-<id>.scope"""
    unknown = CgroupLayout(CgroupKind.UNKNOWN, path)
    qos: str | None = None
    if rest and (m := _SYSTEMD_QOS.match(rest[0])):
        if m["root"] != root:
            return unknown
        qos, rest = m["qos"], rest[1:]
    if not rest:
        return _kube(path, CgroupDriver.SYSTEMD, qos, None)  # a kubepods or QoS slice itself
    pod = _SYSTEMD_POD.match(rest[0])
    if pod is None or pod["root"] != root or pod["qos"] != qos:
        return unknown
    uid = pod["uid"].replace("_", "-")
    if not _UID.match(uid):
        return unknown
    if len(rest) == 1:
        return _kube(path, CgroupDriver.SYSTEMD, qos, uid)
    scope = _SYSTEMD_SCOPE.match(rest[1])
    if scope is None:
        return _kube(path, CgroupDriver.SYSTEMD, qos, uid)  # inside the pod, container unsaid
    return _kube(path, CgroupDriver.SYSTEMD, qos, uid, scope["prefix"], scope["id"])


def _cgroupfs_kubepods(path: str, rest: list[str]) -> CgroupLayout:
    """/kubepods/[<qos>/]pod<uid>/[<rt>-]<id>"""
    unknown = CgroupLayout(CgroupKind.UNKNOWN, path)
    qos: str | None = None
    if rest and rest[0] in (QosClass.BURSTABLE, QosClass.BESTEFFORT):
        qos, rest = rest[0], rest[1:]
    if not rest:
        return _kube(path, CgroupDriver.CGROUPFS, qos, None)
    pod = _CGROUPFS_POD.match(rest[0])
    if pod is None or not _UID.match(pod["uid"]):
        return unknown
    uid = pod["uid"]
    if len(rest) == 1:
        return _kube(path, CgroupDriver.CGROUPFS, qos, uid)
    leaf = _CGROUPFS_CONTAINER.match(rest[1])
    if leaf is None:
        return _kube(path, CgroupDriver.CGROUPFS, qos, uid)
    return _kube(path, CgroupDriver.CGROUPFS, qos, uid, leaf["prefix"], leaf["id"])


def _kube(
    path: str,
    driver: CgroupDriver,
    qos: str | None,
    uid: str | None,
    prefix: str | None = None,
    container_id: str | None = None,
) -> CgroupLayout:
    return CgroupLayout(
        kind=CgroupKind.KUBERNETES,
        path=path,
        driver=driver,
        qos=QosClass(qos) if qos else (QosClass.GUARANTEED if uid else None),
        pod_uid=uid,
        runtime=_runtime(prefix),
        container_id=container_id,
        monitor=bool(prefix and prefix.endswith("-conmon")),
    )


def _runtime(prefix: str | None) -> str | None:
    return dict(RUNTIME_PREFIXES).get(prefix) if prefix else None


def _outside_kubernetes(path: str, parts: list[str]) -> CgroupLayout:
    """podman/docker containers and systemd units on a host that is not (only) a node."""
    for index, part in enumerate(parts):
        if m := _SYSTEMD_SCOPE.match(part):
            return CgroupLayout(
                kind=CgroupKind.CONTAINER,
                path=path,
                driver=CgroupDriver.SYSTEMD,
                runtime=_runtime(m["prefix"]),
                container_id=m["id"],
                monitor=m["prefix"].endswith("-conmon"),
                owner_uid=_owner_uid(parts[:index]),
            )
        nxt = parts[index + 1] if index + 1 < len(parts) else None
        if part == "libpod_parent" and nxt and _POD_ID.match(nxt) and index + 2 < len(parts):
            nxt = parts[index + 2]  # a Podman pod's cgroup, <pod id>, holds its containers'
        if part in ("docker", "libpod_parent") and nxt:
            leaf = _CGROUPFS_CONTAINER.match(nxt)
            if leaf:
                runtime = "docker" if part == "docker" else "podman"
                return CgroupLayout(
                    kind=CgroupKind.CONTAINER,
                    path=path,
                    driver=CgroupDriver.CGROUPFS,
                    runtime=runtime,
                    container_id=leaf["id"],
                    monitor=bool(leaf["prefix"] and leaf["prefix"].endswith("-conmon")),
                )
    units = [p for p in parts if _SERVICE.match(p)]
    if units and _SERVICE.match(parts[0]):
        return CgroupLayout(CgroupKind.HOST, path, CgroupDriver.SYSTEMD, unit=units[-1])
    return CgroupLayout(CgroupKind.UNKNOWN, path)


def _owner_uid(ancestors: list[str]) -> int | None:
    """The user whose systemd instance (user@UID.service) holds the container."""
    for part in ancestors:
        if m := _USER_SERVICE.match(part):
            return int(m["uid"])
    return None
