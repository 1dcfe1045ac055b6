"""Warning Events on pods through events.k8s.io/v1, one growing series per failure kind.

A series is one (pod UID, container, reason, path, binary arch): its Event note is fixed
(events.k8s.io makes the note immutable after create), and each further record only
patches `series.count` and `series.lastObservedTime`. A crash loop therefore stays ONE
Event whose count grows, as client-go's event recorder does for isomorphic events. An
exec that a binfmt_misc emulator ran (Emulated) did not fail: its series, one per pod and
binary like the others, says what ran it, in the diagnosis's words (reason.emulated_detail).

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
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from cachetools import FIFOCache

from execwatch.crd import ParsedRecord
from execwatch.handler.pods import Pod
from execwatch.kube import errors
from execwatch.kube.client import MERGE_PATCH, Rest, path
from execwatch.kube.safe import fit_bytes, is_label_value, printable
from execwatch.record import Reason
from execwatch.runnable.reason import emulated_detail

log = logging.getLogger(__name__)

CONTROLLER = "execwatch.io/handler"
RECORDS_ANNOTATION = "execwatch.io/records"
RING = 32
NOTE_LIMIT = 1024  # bytes: the API server rejects longer notes

# Event reasons and the pod label value: what `kubectl describe pod` shows. A foreign
# architecture reads as the error people search for, and a few names say "Exec" for
# context; every other diagnosis keeps its own name, so a new Reason needs no entry here.
EVENT_REASON_OVERRIDES: dict[Reason, str] = {
    Reason.FOREIGN_ARCHITECTURE: "ExecFormatError",
    Reason.PERMISSION_DENIED: "ExecPermissionDenied",
    Reason.NOT_FOUND: "ExecNotFound",
    Reason.UNDIAGNOSED: "ExecFailed",
}


def event_reason(reason: Reason) -> str:
    """The Event reason and pod label value for a diagnosis (always a valid label value)."""
    name = EVENT_REASON_OVERRIDES.get(reason, str(reason))
    return name if is_label_value(name) and name else "ExecFailed"


def note_for(rec: ParsedRecord) -> str:
    """The Event message: which binary, its architecture against the node's, which container."""
    if rec.reason is Reason.EMULATED:
        return _fit(_emulated_note(rec))
    arch = (
        f"a {rec.binary_arch} binary on a {rec.node_arch} node"
        if rec.binary_arch and rec.reason is not Reason.FOREIGN_OS  # its detail names the OS
        else f"on a {rec.node_arch} node"
    )
    parts = [f'container "{rec.container or "?"}" could not exec {rec.path} ({rec.errno}): {arch}']
    if rec.interpreter:
        parts.append(f"interpreter {rec.interpreter}")
    parts.append(f"node {rec.node}")
    if rec.detail:
        parts.append(rec.detail)
    return _fit("; ".join(parts))


def _emulated_note(rec: ParsedRecord) -> str:
    """An exec that succeeded: what ran it, never "could not exec"."""
    how = emulated_detail(rec.binary_arch, rec.interpreter, rec.node_arch)
    return f'container "{rec.container or "?"}" ran {rec.path}: {how}; node {rec.node}'


def _fit(note: str) -> str:
    return fit_bytes(printable(note, 4 * NOTE_LIMIT), NOTE_LIMIT)


def series_name(rec: ParsedRecord, pod_name: str, pod_uid: str) -> str:
    digest = hashlib.sha256(
        "\0".join((pod_uid, rec.container, str(rec.reason), rec.path, rec.binary_arch)).encode()
    ).hexdigest()[:16]
    return f"{pod_name[:200]}.execwatch-{digest}"


def _events_path(namespace: str, name: str | None = None) -> str:
    parts = ("apis", "events.k8s.io", "v1", "namespaces", namespace, "events")
    return path(*parts, *((name,) if name else ()))


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
    """Creates or grows the series Event for one record; returns False if already in it.

    Create first: a new series is one POST, and only a 409 (the series exists) costs a
    read. A known series is patched from the cached state; a 409 (someone else wrote it
    since) or 404 (it expired) re-reads it."""

    rest: Rest
    instance: str
    clock: Callable[[], float]
    cache_size: int = 4096
    _cache: FIFOCache[str, _Series] = field(init=False)  # a write makes one the newest
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._cache = FIFOCache(self.cache_size)

    def record(self, rec: ParsedRecord, pod: Pod, container_index: str | None) -> bool:
        """Fold `rec` into its pod's series Event. True if written, False if already there."""
        name = series_name(rec, pod.name, pod.uid)
        key = f"{pod.namespace}/{name}"
        marker = f"{rec.name}/{rec.uid}"
        with self._lock:
            state = self._cache.get(key)
        for _attempt in range(4):
            if state is None:
                try:
                    self._create(rec, pod, name, marker, container_index)
                    return True
                except errors.ConflictError:
                    state = self._get(pod.namespace, name)
                    continue
            if any(m == marker for m in state.records):
                return False
            if any(m.split("/", 1)[0] == rec.name for m in state.records):
                # Same record name, new UID: an agent re-created a record this handler
                # already folded in and deleted (its create's answer was lost). Not new.
                raise DuplicateRecord(rec.name)
            try:
                self._patch(rec, pod.namespace, name, state, marker)
                return True
            except (errors.ConflictError, errors.NotFoundError):
                state = self._get(pod.namespace, name)
        raise EventConflict(name)

    def _get(self, ns: str, name: str) -> _Series | None:
        try:
            ev = self.rest.call("GET", _events_path(ns, name))
        except errors.NotFoundError:
            self._forget(f"{ns}/{name}")
            return None
        meta = ev.get("metadata") or {}
        series = int((ev.get("series") or {}).get("count") or 1)
        try:
            records = json.loads((meta.get("annotations") or {}).get(RECORDS_ANNOTATION, "[]"))
        except ValueError:
            records = []
        if not isinstance(records, list):
            records = []
        state = _Series(series, [str(r) for r in records], str(meta.get("resourceVersion")))
        self._remember(f"{ns}/{name}", state)
        return state

    def _remember(self, key: str, state: _Series) -> None:
        with self._lock:
            self._cache[key] = state

    def _forget(self, key: str) -> None:
        with self._lock:
            self._cache.pop(key, None)

    def _create(
        self, rec: ParsedRecord, pod: Pod, name: str, marker: str, container_index: str | None
    ) -> None:
        now = self.clock()
        ns = pod.namespace
        regarding: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": pod.name,
            "namespace": ns,
            "uid": pod.uid,
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
        created = self.rest.call("POST", _events_path(ns), body=body)
        rv = str(created["metadata"]["resourceVersion"])
        self._remember(f"{ns}/{name}", _Series(rec.count, [marker], rv))

    def _patch(self, rec: ParsedRecord, ns: str, name: str, state: _Series, marker: str) -> None:
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
        patched = self.rest.call(
            "PATCH", _events_path(ns, name), body=body, content_type=MERGE_PATCH
        )
        rv = str(patched["metadata"]["resourceVersion"])
        self._remember(f"{ns}/{name}", _Series(count, records, rv))


class DuplicateRecord(Exception):
    """A record whose name was already folded into its series under another UID."""
