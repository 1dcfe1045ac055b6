"""Expiry of ImageVerdicts: the controller's leader deletes verdicts unused for `ttl` and
keeps their number at most `max_objects`, the least recently used deleted first.

A verdict is used when it is written or when it decides a pod (scanned.py renews its
`lastUsed`); one never written since its creation counts from its creationTimestamp. The
sweep lists in pages and keeps only the `max_objects` most recently used in memory, so
its memory is bounded whatever the number of objects. Each delete is conditional on the
resourceVersion listed: a verdict written or used meanwhile is kept.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from execwatch.crd import parse_time
from execwatch.kube import errors
from execwatch.kube.client import Rest, path
from execwatch.placement.verdicts import GROUP, PLURAL, VERSION

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExpiryConfig:
    ttl: float = 7 * 86400.0  # seconds unused before a verdict is deleted
    max_objects: int = 10000
    period: float = 3600.0  # seconds between sweeps
    first_after: float = 60.0  # seconds from becoming leader to the first sweep
    page: int = 500


@dataclass(frozen=True, order=True)
class _Entry:
    used: float
    name: str
    resource_version: str


@dataclass
class VerdictExpiry:
    rest: Rest
    config: ExpiryConfig = field(default_factory=ExpiryConfig)
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    wall: Callable[[], float] = time.time

    def __post_init__(self) -> None:
        self.deleted = Counter(
            "execwatch_verdicts_expired",
            "ImageVerdicts deleted, by why (unused: not used for the TTL; over_max: the "
            "least recently used past the maximum count).",
            ["why"],
            registry=self.registry,
        )

    def run(self, term: threading.Event) -> None:
        """Sweep every `period` while `term` is not set (the leader's term)."""
        wait = self.config.first_after
        while not term.wait(wait):
            try:
                self.sweep()
            except errors.ApiError as err:
                log.warning("verdict expiry sweep failed", extra={"kv": errors.as_dict(err)})
            wait = self.config.period

    def sweep(self) -> int:
        """One pass: how many verdicts it deleted."""
        cutoff = self.wall() - self.config.ttl
        newest: list[_Entry] = []  # a min-heap of the most recently used kept so far
        deleted = 0
        for obj in self._list():
            entry = _entry(obj)
            if entry.used < cutoff:
                deleted += self._delete(entry, "unused")
                continue
            heapq.heappush(newest, entry)
            if len(newest) > self.config.max_objects:
                deleted += self._delete(heapq.heappop(newest), "over_max")
        return deleted

    def _list(self) -> Any:
        url = path("apis", GROUP, VERSION, PLURAL)
        token = ""
        while True:
            query: dict[str, str | int] = {"limit": self.config.page}
            if token:
                query["continue"] = token
            page = self.rest.call("GET", url, query=query)
            yield from page.get("items") or []
            token = str((page.get("metadata") or {}).get("continue") or "")
            if not token:
                return

    def _delete(self, entry: _Entry, why: str) -> int:
        body = {
            "kind": "DeleteOptions",
            "apiVersion": "v1",
            "preconditions": {"resourceVersion": entry.resource_version},
        }
        try:
            self.rest.call("DELETE", path("apis", GROUP, VERSION, PLURAL, entry.name), body=body)
        except (errors.NotFoundError, errors.ConflictError):
            return 0  # gone, or written since the list: in use
        self.deleted.labels(why).inc()
        return 1


def _entry(obj: Mapping[str, Any]) -> _Entry:
    meta, status = obj.get("metadata") or {}, obj.get("status") or {}
    used = parse_time(status.get("lastUsed")) or parse_time(meta.get("creationTimestamp")) or 0.0
    return _Entry(used, str(meta.get("name") or ""), str(meta.get("resourceVersion") or ""))
