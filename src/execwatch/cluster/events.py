"""Warning Events on pods through events.k8s.io/v1, one growing series per failure kind.

A series is one (pod UID, container, reason, path, binary arch): its Event note is fixed
(events.k8s.io makes the note immutable after create), and each further record only
patches `series.count` and `series.lastObservedTime`. A crash loop therefore stays ONE
Event whose count grows, as client-go's event recorder does for isomorphic events.

Idempotence across restarts and failover: the Event carries the names and UIDs of the
last records folded into it (annotation `execwatch.io/records`). A handler that re-reads
a record it already added (it crashed before deleting the record, or lost the Lease) sees
it there and does not add it twice. Patches carry the resourceVersion they were computed
from, so two handlers racing on one series cannot lose or double an increment.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from execwatch.cluster import errors
from execwatch.cluster.crd import Record
from execwatch.cluster.safe import fit_bytes, printable
from execwatch.record import Reason

log = logging.getLogger(__name__)

CONTROLLER = "execwatch.io/handler"
RECORDS_ANNOTATION = "execwatch.io/records"
RING = 32
NOTE_LIMIT = 1024  # bytes: the API server rejects longer notes

# Event reasons and the pod label value: what `kubectl describe pod` shows. A foreign
# architecture reads as the error people search for; the rest keep the diagnosis name.
EVENT_REASONS: dict[Reason, str] = {
    Reason.FOREIGN_ARCHITECTURE: "ExecFormatError",
    Reason.MISSING_INTERPRETER: "MissingInterpreter",
    Reason.BAD_INTERPRETER: "BadInterpreter",
    Reason.MISSING_SHEBANG_INTERPRETER: "MissingShebangInterpreter",
    Reason.NO_SHEBANG: "NoShebang",
    Reason.CORRUPT_BINARY: "CorruptBinary",
    Reason.PERMISSION_DENIED: "ExecPermissionDenied",
    Reason.NOT_FOUND: "ExecNotFound",
    Reason.UNDIAGNOSED: "ExecFailed",
}


def event_reason(reason: Reason) -> str:
    return EVENT_REASONS.get(reason, "ExecFailed")


def note_for(rec: Record) -> str:
    """The Event message: which binary, its architecture against the node's, which container."""
    arch = (
        f"a {rec.binary_arch} binary on a {rec.node_arch} node"
        if rec.binary_arch
        else f"on a {rec.node_arch} node"
    )
    parts = [f'container "{rec.container or "?"}" could not exec {rec.path} ({rec.errno}): {arch}']
    if rec.interpreter:
        parts.append(f"interpreter {rec.interpreter}")
    parts.append(f"node {rec.node}")
    if rec.detail:
        parts.append(rec.detail)
    return fit_bytes(printable("; ".join(parts), 4 * NOTE_LIMIT), NOTE_LIMIT)


def series_name(rec: Record, pod_name: str, pod_uid: str) -> str:
    digest = hashlib.sha256(
        "\0".join((pod_uid, rec.container, str(rec.reason), rec.path, rec.binary_arch)).encode()
    ).hexdigest()[:16]
    return f"{pod_name[:200]}.execwatch-{digest}"


def _micro(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class EventConflict(Exception):
    """The series changed under us; the caller retries the record."""


@dataclass
class _Series:
    count: int
    records: list[str]
    resource_version: str


@dataclass
class EventWriter:
    """Creates or grows the series Event for one record; returns False if already in it."""

    api_client: Any
    instance: str
    clock: Callable[[], float]
    timeout: float = 10.0
    cache_size: int = 4096
    _cache: OrderedDict[str, _Series] = field(default_factory=OrderedDict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        from kubernetes import client

        self._api = client.EventsV1Api(self.api_client)

    def record(self, rec: Record, pod: dict[str, Any], container_index: str | None) -> bool:
        """Fold `rec` into its pod's series Event. True if written, False if already there."""
        meta = pod["metadata"]
        ns, pod_name, pod_uid = meta["namespace"], meta["name"], meta["uid"]
        name = series_name(rec, pod_name, pod_uid)
        marker = f"{rec.name}/{rec.uid}"
        for _attempt in range(4):
            state = self._get(ns, name)
            if state is None:
                try:
                    with errors.translate():
                        self._create(rec, ns, name, pod_name, pod_uid, marker, container_index)
                    return True
                except errors.ConflictError:
                    self._forget(name)
                    continue
            if any(m == marker for m in state.records):
                return False
            if any(m.split("/", 1)[0] == rec.name for m in state.records):
                # Same record name, new UID: an agent re-created a record this handler
                # already folded in and deleted (its create's answer was lost). Not new.
                raise DuplicateRecord(rec.name)
            try:
                with errors.translate():
                    self._patch(rec, ns, name, state, marker)
                return True
            except (errors.ConflictError, errors.NotFoundError):
                self._forget(name)
        raise EventConflict(name)

    def _get(self, ns: str, name: str) -> _Series | None:
        key = f"{ns}/{name}"
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                return cached
        try:
            with errors.translate():
                resp = self._api.read_namespaced_event(
                    name, ns, _request_timeout=self.timeout, _preload_content=False
                )
        except errors.NotFoundError:
            return None
        ev = json.loads(resp.data)
        meta = ev.get("metadata") or {}
        series = int((ev.get("series") or {}).get("count") or 1)
        try:
            records = json.loads((meta.get("annotations") or {}).get(RECORDS_ANNOTATION, "[]"))
        except ValueError:
            records = []
        state = _Series(series, [str(r) for r in records], str(meta.get("resourceVersion")))
        self._remember(key, state)
        return state

    def _remember(self, key: str, state: _Series) -> None:
        with self._lock:
            self._cache[key] = state
            self._cache.move_to_end(key)
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)

    def _forget(self, name: str) -> None:
        with self._lock:
            for key in [k for k in self._cache if k.endswith("/" + name)]:
                del self._cache[key]

    def _create(
        self,
        rec: Record,
        ns: str,
        name: str,
        pod_name: str,
        pod_uid: str,
        marker: str,
        container_index: str | None,
    ) -> None:
        now = self.clock()
        regarding: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": pod_name,
            "namespace": ns,
            "uid": pod_uid,
        }
        if container_index:
            regarding["fieldPath"] = container_index
        body: dict[str, Any] = {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {
                "name": name,
                "namespace": ns,
                "labels": {"app.kubernetes.io/managed-by": "execwatch"},
                "annotations": {RECORDS_ANNOTATION: json.dumps([marker])},
            },
            "eventTime": _micro(rec.first_seen),
            "reportingController": CONTROLLER,
            "reportingInstance": self.instance[:128],
            "action": "Exec",
            "reason": event_reason(rec.reason),
            "regarding": regarding,
            "note": note_for(rec),
            "type": "Warning",
        }
        if rec.count >= 2:  # the API requires series.count >= 2
            body["series"] = {
                "count": rec.count,
                "lastObservedTime": _micro(max(rec.last_seen, now)),
            }
        resp = self._api.create_namespaced_event(
            ns, body, _request_timeout=self.timeout, _preload_content=False
        )
        rv = str(json.loads(resp.data)["metadata"]["resourceVersion"])
        self._remember(f"{ns}/{name}", _Series(rec.count, [marker], rv))

    def _patch(self, rec: Record, ns: str, name: str, state: _Series, marker: str) -> None:
        count = state.count + rec.count
        records = [*state.records, marker][-RING:]
        body = {
            "metadata": {
                "resourceVersion": state.resource_version,
                "annotations": {RECORDS_ANNOTATION: json.dumps(records)},
            },
            "series": {
                "count": count,
                "lastObservedTime": _micro(max(rec.last_seen, self.clock())),
            },
        }
        resp = self._api.patch_namespaced_event(
            name,
            ns,
            body,
            _request_timeout=self.timeout,
            _content_type="application/merge-patch+json",
            _preload_content=False,
        )
        rv = str(json.loads(resp.data)["metadata"]["resourceVersion"])
        self._remember(f"{ns}/{name}", _Series(count, records, rv))


class DuplicateRecord(Exception):
    """A record whose name was already folded into its series under another UID."""
