"""The ExecFailure custom resource: how a record is written by the agent and read back.

The schema lives in deploy/base/crd.yaml; this module is its Python side. The agent
builds the whole object in `to_body` (one create, nothing to fill in later). The handler
never trusts what it reads: `parse` re-checks every field the schema checks, because a
record may predate a schema change or come from an agent that is not ours.

The schema's bounds are stated once, in the tables below (`MAX_LENGTH`, `REQUIRED`,
`COUNT`, `UID`, `SYSCALLS`): `to_body` and `parse` use them, and
tests/deploy/test_crd_bounds.py fails when the yaml says otherwise.
"""

from __future__ import annotations

import errno as errno_mod
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

from execwatch.kube import client
from execwatch.kube.safe import printable
from execwatch.record import AttributionStatus, ExecFailed, ExecFailure, KernelEvent, Reason
from execwatch.text import safe_text

GROUP = "execwatch.io"
VERSION = "v1alpha1"
PLURAL = "execfailures"
KIND = "ExecFailure"
DEFAULT_NAMESPACE = "execwatch"

MAX_PATH = 4096
MAX_DETAIL = 1024
MAX_COMM = 64
MAX_NAME = 253
MAX_ARCH = 32

# The schema's maxLength of every string of spec, by its dotted path.
MAX_LENGTH: Mapping[str, int] = MappingProxyType(
    {
        "node": MAX_NAME,
        "nodeArch": MAX_ARCH,
        "errno": 32,
        "detail": MAX_DETAIL,
        "path": MAX_PATH,
        "binaryArch": MAX_ARCH,
        "interpreter": MAX_PATH,
        "comm": MAX_COMM,
        "parentComm": MAX_COMM,
        "pod.name": MAX_NAME,
        "pod.namespace": 63,
        "pod.uid": 64,
        "container.name": MAX_NAME,
        "container.id": 128,
        "container.image": 1024,
        "container.runtime": 32,
        "workload.kind": 63,
        "workload.name": MAX_NAME,
        "cgroup": MAX_PATH,
    }
)
# spec's required fields (a required string must not be empty either)
REQUIRED = (
    "node", "nodeArch", "errno", "reason", "path", "firstSeen", "lastSeen", "count", "attribution",
)  # fmt: skip
COUNT = (1, 1_000_000_000)  # spec.count: minimum, maximum
UID = (0, 4294967295)  # spec.uid: minimum, maximum

_DNS_LABEL = re.compile(r"[^a-z0-9-]+")


SYSCALLS = ("execve", "execveat", "exit_group", "signal")  # the CRD's enum


def _status(e: KernelEvent) -> str:
    """ENOEXEC for a failed exec; EXIT127 or SIGSEGV for a death right after one;
    EMULATED for an exec an emulator ran."""
    if not isinstance(e, ExecFailed):
        return e.status
    return errno_mod.errorcode.get(e.errno, f"E{e.errno}".replace("-", ""))


def rfc3339(ts: float) -> str:
    """Seconds since the epoch as the RFC 3339 UTC string the API server expects."""
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# What the handler can write back as an Event's MicroTime: 1970 up to the end of year 9999.
# The schema's date-time format allows more (0001-01-01T00:00:00+14:00 is year 0 in UTC).
MAX_TIME = 253402300799.0


def parse_time(value: object) -> float | None:
    """Seconds since the epoch of an RFC 3339 string, or None if it is not one the
    handler can use (checked here, once, so nothing fails on it later)."""
    if isinstance(value, datetime):
        ts = value.timestamp()
    elif isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
        if parsed.tzinfo is None:  # the schema's date-time also takes local-time forms
            parsed = parsed.replace(tzinfo=UTC)
        try:
            ts = parsed.timestamp()
        except (OverflowError, ValueError):
            return None
    else:
        return None
    return ts if 0.0 <= ts <= MAX_TIME else None


def record_name(node: str, nonce: str, seq: int) -> str:
    """A deterministic, DNS-safe object name for one sealed record.

    The same name is reused on every retry of one record, so a create whose answer was
    lost returns 409 AlreadyExists instead of making a second record: the agent side of
    "never count one record twice".
    """
    prefix = _DNS_LABEL.sub("-", node.lower()).strip("-")[:40] or "node"
    digest = hashlib.sha256(f"{node}\0{nonce}\0{seq}".encode()).hexdigest()[:16]
    return f"{prefix}-{digest}"


def _opt(value: str | None, dotted: str) -> str | None:
    return None if value is None else safe_text(value, MAX_LENGTH[dotted])


def to_body(
    failure: ExecFailure,
    *,
    name: str,
    namespace: str,
    node: str,
    first_seen: float,
    last_seen: float,
    count: int,
) -> dict[str, Any]:
    """The complete ExecFailure object for one create."""
    e, d, a = failure.event, failure.diagnosis, failure.attribution
    spec: dict[str, Any] = {
        "node": safe_text(node, MAX_NAME),
        "nodeArch": safe_text(d.node_arch or "unknown", MAX_ARCH),
        "errno": _status(e)[: MAX_LENGTH["errno"]],
        "reason": str(d.reason),
        "detail": safe_text(d.detail, MAX_DETAIL),
        "path": safe_text(e.path, MAX_PATH) or "?",
        "comm": safe_text(e.comm, MAX_COMM),
        "parentComm": safe_text(e.parent_comm, MAX_COMM),
        "syscall": e.syscall if e.syscall in SYSCALLS else "execve",
        "uid": max(UID[0], min(e.uid, UID[1])),
        "firstSeen": rfc3339(first_seen),
        "lastSeen": rfc3339(max(first_seen, last_seen)),
        "count": max(COUNT[0], count),
        "attribution": str(a.status),
    }
    if d.binary_arch:
        spec["binaryArch"] = safe_text(d.binary_arch, MAX_ARCH)
    if d.interpreter:
        spec["interpreter"] = safe_text(d.interpreter, MAX_PATH)
    pod = {
        k: v
        for k, v in (
            ("name", _opt(a.pod, "pod.name")),
            ("namespace", _opt(a.namespace, "pod.namespace")),
            ("uid", _opt(a.pod_uid, "pod.uid")),
        )
        if v
    }
    if pod:
        spec["pod"] = pod
    container = {
        k: v
        for k, v in (
            ("name", _opt(a.container, "container.name")),
            ("id", _opt(a.container_id, "container.id")),
            ("image", _opt(a.image, "container.image")),
            ("runtime", _opt(a.runtime, "container.runtime")),
        )
        if v
    }
    if container:
        spec["container"] = container
    if a.workload:
        spec["workload"] = {
            "kind": safe_text(a.workload_kind or "", MAX_LENGTH["workload.kind"]),
            "name": safe_text(a.workload, MAX_LENGTH["workload.name"]),
        }
    if a.cgroup_path and a.status in (AttributionStatus.UNATTRIBUTED, AttributionStatus.HOST):
        spec["cgroup"] = safe_text(a.cgroup_path, MAX_PATH)
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": "execwatch-agent"},
        },
        "spec": spec,
    }


class InvalidRecord(ValueError):
    """A record the handler cannot act on; `kind` becomes the invalid counter's label."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True, slots=True)
class ParsedRecord:
    """An ExecFailure as the handler reads it: validated, typed, strings already safe."""

    name: str
    uid: str
    node: str
    node_arch: str
    errno: str
    reason: Reason
    path: str
    count: int
    first_seen: float
    last_seen: float
    attribution: AttributionStatus
    binary_arch: str = ""
    interpreter: str = ""
    detail: str = ""
    comm: str = ""
    pod: str = ""
    namespace: str = ""
    pod_uid: str = ""
    container: str = ""
    container_id: str = ""
    image: str = ""
    workload_kind: str = ""
    workload: str = ""

    @property
    def names_pod(self) -> bool:
        return bool(self.pod and self.namespace)


def _str(spec: dict[str, Any], dotted: str) -> str:
    """spec's string at `dotted` (`pod.name`), checked against MAX_LENGTH and REQUIRED."""
    parent, _, key = dotted.rpartition(".")
    value = (_sub(spec, parent) if parent else spec).get(key)
    limit, required = MAX_LENGTH[dotted], dotted in REQUIRED
    if value is None:
        if required:
            raise InvalidRecord("malformed", f"missing spec.{dotted}")
        return ""
    if not isinstance(value, str):
        raise InvalidRecord("malformed", f"spec.{dotted} is not a string")
    if len(value) > limit:
        raise InvalidRecord("oversized", f"spec.{dotted} is longer than {limit}")
    if required and not value:
        raise InvalidRecord("malformed", f"spec.{dotted} is empty")
    return printable(value, limit)


def _sub(spec: dict[str, Any], key: str) -> dict[str, Any]:
    value = spec.get(key) or {}
    if not isinstance(value, dict):
        raise InvalidRecord("malformed", f"spec.{key} is not an object")
    return value


def parse(obj: dict[str, Any]) -> ParsedRecord:
    """Validate one ExecFailure object read from the API server."""
    meta = obj.get("metadata")
    spec = obj.get("spec")
    if not isinstance(meta, dict) or not isinstance(spec, dict):
        raise InvalidRecord("malformed", "no metadata or spec")
    name, uid = meta.get("name"), meta.get("uid")
    if not isinstance(name, str) or not isinstance(uid, str):
        raise InvalidRecord("malformed", "no name or uid")
    try:
        reason = Reason(str(spec.get("reason")))
    except ValueError:
        raise InvalidRecord("malformed", "unknown reason") from None
    try:
        attribution = AttributionStatus(str(spec.get("attribution", "unattributed")))
    except ValueError:
        raise InvalidRecord("malformed", "unknown attribution") from None
    count = spec.get("count")
    if isinstance(count, bool) or not isinstance(count, int) or not COUNT[0] <= count <= COUNT[1]:
        raise InvalidRecord("malformed", "count out of range")
    first, last = parse_time(spec.get("firstSeen")), parse_time(spec.get("lastSeen"))
    if first is None or last is None or last < first:
        raise InvalidRecord("malformed", "bad firstSeen/lastSeen")
    return ParsedRecord(
        name=name,
        uid=uid,
        node=_str(spec, "node"),
        node_arch=_str(spec, "nodeArch"),
        errno=_str(spec, "errno"),
        reason=reason,
        path=_str(spec, "path"),
        count=count,
        first_seen=first,
        last_seen=last,
        attribution=attribution,
        binary_arch=_str(spec, "binaryArch"),
        interpreter=_str(spec, "interpreter"),
        detail=_str(spec, "detail"),
        comm=_str(spec, "comm"),
        pod=_str(spec, "pod.name"),
        namespace=_str(spec, "pod.namespace"),
        pod_uid=_str(spec, "pod.uid"),
        container=_str(spec, "container.name"),
        container_id=_str(spec, "container.id"),
        image=_str(spec, "container.image"),
        workload_kind=_str(spec, "workload.kind"),
        workload=_str(spec, "workload.name"),
    )


def records_path(namespace: str, name: str | None = None) -> str:
    parts = ("apis", GROUP, VERSION, "namespaces", namespace, PLURAL)
    return client.path(*parts, *((name,) if name else ()))
