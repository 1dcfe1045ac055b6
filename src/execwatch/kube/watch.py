"""List + watch API objects into a sink (client-go's reflector): a work queue
(`QueueSink`: the handler's records, placement's gated pods) or a cache (the agent's pods).

A watch broken by an API server restart resumes from the last resourceVersion; if that
is too old (410 Gone) the watcher lists again. The handler watches its ExecFailure
records (deleted once handled, so a list sees exactly the unhandled ones: nothing is
lost); the placement controller watches gated pods by label. The watch response is read
unparsed so that `interrupt()` (stop, lost Lease) can shut its socket and end a blocked
read at once.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from execwatch.kube import backoff, errors
from execwatch.kube.client import Rest
from execwatch.kube.workqueue import WorkQueue

log = logging.getLogger(__name__)


class WatchMetrics(Protocol):
    @property
    def api_errors(self) -> Any:
        """A Counter labelled (verb, code): failed list and watch calls."""


class WatchSink(Protocol):
    """Where a watch's objects go. A list is a full snapshot: between `listing()` and
    `listed()` every object that exists is upserted, so a cache can drop what was not."""

    def listing(self) -> None: ...
    def upsert(self, obj: dict[str, Any]) -> None: ...
    def delete(self, obj: dict[str, Any]) -> None: ...
    def listed(self) -> None: ...


@dataclass
class QueueSink:
    """Objects into a work queue; a deleted one leaves it, and `on_deleted` is told."""

    queue: WorkQueue
    on_deleted: Callable[[str, str], None] = lambda name, uid: None

    def listing(self) -> None:
        pass

    def upsert(self, obj: dict[str, Any]) -> None:
        self.queue.add(obj)

    def delete(self, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        self.queue.forget(self.queue.key(obj))
        self.on_deleted(str(meta.get("name")), str(meta.get("uid")))

    def listed(self) -> None:
        pass


MAX_EVENT = 4 * 1024 * 1024  # bytes of one watch line; a record is at most ~20 KiB


@dataclass(frozen=True)
class WatchConfig:
    namespace: str
    resource: str  # the list path (crd.records_path, a pods path)
    label_selector: str = ""
    field_selector: str = ""
    watch_timeout: int = 300  # seconds; the server ends each watch after this
    resync_period: float = 300.0
    request_timeout: float = 10.0
    retry_initial: float = 0.5
    retry_max: float = 30.0
    list_page: int = 500


@dataclass
class Watcher:
    config: WatchConfig
    rest: Rest
    sink: WatchSink
    metrics: WatchMetrics
    clock: Callable[[], float] = time.monotonic
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _resp: Any = None

    @property
    def _path(self) -> str:
        return self.config.resource

    def _query(self, **extra: str | int) -> dict[str, str | int]:
        selectors = {
            "labelSelector": self.config.label_selector,
            "fieldSelector": self.config.field_selector,
        }
        return {**{k: v for k, v in selectors.items() if v}, **extra}

    def _list(self) -> str:
        """Hand over every object that exists now, in pages; return the snapshot's
        resourceVersion (the same on every page) to watch from."""
        token: str | None = None
        self.sink.listing()
        while True:
            query = self._query(limit=self.config.list_page)
            if token:
                query["continue"] = token
            result = self.rest.call("GET", self._path, query=query)
            for obj in result.get("items") or []:
                self.sink.upsert(obj)
            meta = result.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                self.sink.listed()
                return str(meta["resourceVersion"])

    def run(self, term: threading.Event) -> None:
        rv: str | None = None
        failures = 0
        last_list = 0.0
        while not term.is_set():
            try:
                if rv is None or self.clock() - last_list > self.config.resync_period:
                    rv = self._list()
                    last_list = self.clock()
                rv = self._watch_once(rv, term)
                failures = 0
            except errors.ApiError as err:
                if term.is_set():
                    return
                if isinstance(err, errors.ExpiredError):
                    rv = None
                self.metrics.api_errors.labels("watch", errors.code(err)).inc()
                log.warning("watch interrupted", extra={"kv": errors.as_dict(err)})
                failures += 1
                wait = backoff.delay(failures, self.config.retry_initial, self.config.retry_max)
                term.wait(errors.delay(err, wait))

    def _watch_once(self, rv: str, term: threading.Event) -> str | None:
        """One watch request from `rv`; returns where to resume (None: list again)."""
        query = self._query(
            watch="true",
            resourceVersion=rv,
            allowWatchBookmarks="true",
            timeoutSeconds=self.config.watch_timeout,
        )
        timeouts = (self.config.request_timeout, self.config.watch_timeout + 30.0)
        resp = self.rest.stream(self._path, query, timeouts)
        with self._lock:
            self._resp = resp
        try:
            if term.is_set():
                return rv
            for event in _events(resp):
                if term.is_set():
                    break
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    err = errors.from_status(int(obj.get("code") or 0), str(obj.get("reason")))
                    if isinstance(err, errors.ExpiredError):
                        log.info("watch expired, listing again")
                        return None
                    raise err
                meta = obj.get("metadata") or {}
                rv = str(meta.get("resourceVersion") or rv)
                if kind in ("ADDED", "MODIFIED"):
                    self.sink.upsert(obj)
                elif kind == "DELETED":
                    self.sink.delete(obj)
            return rv
        except (OSError, ValueError) as exc:  # the stream broke, or a torn line
            raise errors.RetryableError(0, type(exc).__name__, str(exc)[:200]) from exc
        finally:
            with self._lock:
                self._resp = None
            with contextlib.suppress(Exception):
                resp.close()

    def interrupt(self) -> None:
        with self._lock:
            resp = self._resp
        if resp is not None:
            with contextlib.suppress(Exception):
                resp.shutdown()


def _events(resp: Any) -> Iterator[dict[str, Any]]:
    """The watch events of a streamed response, one JSON document per line."""
    buf = b""
    for chunk in resp.chunks(64 * 1024):
        buf += chunk
        if len(buf) > MAX_EVENT:
            raise ValueError(f"watch event longer than {MAX_EVENT} bytes")
        *lines, buf = buf.split(b"\n")
        for line in lines:
            if line.strip():
                event = json.loads(line)
                if isinstance(event, dict):
                    yield event
