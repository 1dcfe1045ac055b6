"""Agent side: turn ExecFailure values into ExecFailure objects in the API server.

What it guarantees, and how:
- **One create per record, complete.** The object carries everything (`crd.to_body`).
- **A crash loop is not a flood.** Failures with the same key (container, path, reason,
  errno) are folded into one pending record; a key gets at most one record per
  `aggregation_window` (the first one goes out at once, so detection stays fast).
- **Rate limit.** A token bucket bounds creates per second across all keys; what waits
  keeps aggregating.
- **API server outages lose nothing within a bound.** Records that could not be created
  stay in the spool (pending, being sent or awaiting retry: at most `spool_size` records) and are
  retried with exponential backoff and jitter. A failure that would need a new record
  while the spool is full is dropped and counted (`dropped_total{type="spool_full"}`).
- **A retry never makes a second record.** A record's name is fixed when it is sealed,
  so re-sending after a lost answer gets 409 AlreadyExists, which counts as success.

`submit` never blocks on the network: the probe's ring buffer must keep draining.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from execwatch.cluster import crd, errors
from execwatch.cluster.metrics import PublisherMetrics
from execwatch.record import AttributionStatus, ExecFailure
from execwatch.text import safe_text

log = logging.getLogger(__name__)

Key = tuple[str, str, str, int]


class RecordSink(Protocol):
    """Where sealed records go; the Kubernetes implementation is `ApiSink`."""

    def create(self, body: dict[str, Any]) -> None:
        """Create the object; raise `SinkError` on failure."""


class SinkError(Exception):
    """A create that failed. `status` is the HTTP status, 0 if there was no answer; what
    it means is decided once, by `execwatch.cluster.errors`."""

    def __init__(self, status: int, message: str, error: errors.ApiError | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.error = error if error is not None else errors.from_status(status, message=message)

    @property
    def already_exists(self) -> bool:
        return isinstance(self.error, errors.ConflictError)

    @property
    def ambiguous(self) -> bool:
        """The object may have been created although the call failed: no answer, or a
        server-side timeout (500/504). Such a record is retried under the same name."""
        return self.error.may_have_acted

    @property
    def permanent(self) -> bool:
        """The API server refused the object itself: retrying cannot help."""
        return isinstance(self.error, errors.PermanentError)


class ApiSink:
    """Creates records through the official client's CustomObjectsApi."""

    def __init__(self, api_client: Any, namespace: str, timeout: float = 10.0) -> None:
        from kubernetes import client

        self._api = client.CustomObjectsApi(api_client)
        self._namespace = namespace
        self._timeout = timeout

    def create(self, body: dict[str, Any]) -> None:
        try:
            with errors.translate():
                self._api.create_namespaced_custom_object(
                    crd.GROUP,
                    crd.VERSION,
                    self._namespace,
                    crd.PLURAL,
                    body,
                    _request_timeout=self._timeout,
                )
        except errors.ApiError as err:
            raise SinkError(err.status, str(err), err) from None


@dataclass(frozen=True)
class PublisherConfig:
    node: str
    namespace: str = crd.DEFAULT_NAMESPACE
    aggregation_window: float = 60.0
    rate: float = 20.0  # creates per second
    burst: int = 50
    spool_size: int = 2000  # records held: pending, being sent, awaiting retry
    backoff_initial: float = 0.5
    backoff_max: float = 30.0


@dataclass
class _Pending:
    failure: ExecFailure
    first_seen: float
    last_seen: float
    count: int
    due: float


@dataclass
class _Sealed:
    key: Key
    body: dict[str, Any]
    count: int
    source: _Pending
    attempts: int = 0
    maybe_created: bool = False  # an earlier attempt may have created it


def aggregation_key(failure: ExecFailure) -> Key:
    """Failures that are 'the same' for an administrator: one container, one path."""
    a = failure.attribution
    who = a.container_id or a.pod_uid or a.cgroup_path or f"cgroup:{failure.event.cgroup_id}"
    return (who, failure.event.path, str(failure.diagnosis.reason), failure.event.errno)


@dataclass
class _TokenBucket:
    rate: float
    burst: int
    clock: Callable[[], float]
    tokens: float = 0.0
    stamp: float = 0.0

    def __post_init__(self) -> None:
        self.tokens = float(self.burst)
        self.stamp = self.clock()

    def wait_time(self) -> float:
        """Seconds until a token is available (0: take one now)."""
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1:
            return 0.0
        return (1 - self.tokens) / self.rate

    def take(self) -> None:
        self.tokens -= 1


@dataclass
class Publisher:
    """Aggregates, rate-limits, spools and creates records; one worker thread."""

    config: PublisherConfig
    sink: RecordSink
    metrics: PublisherMetrics = field(default_factory=PublisherMetrics)
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time

    def __post_init__(self) -> None:
        self._lock = threading.Condition()
        self._pending: dict[Key, _Pending] = {}
        self._retry: list[_Sealed] = []
        self._sending: _Sealed | None = None  # taken off the lists while its create runs
        self._last_sent: dict[Key, float] = {}
        self._bucket = _TokenBucket(self.config.rate, self.config.burst, self.clock)
        self._nonce = os.urandom(6).hex()
        self._seq = 0
        self._backoff = 0.0
        self._retry_at = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- producer side ---------------------------------------------------------------

    def submit(self, failure: ExecFailure) -> None:
        """Take one failure (or a pre-folded run of them); never blocks on the network."""
        now, wall = self.clock(), failure.event.time or self.wall()
        n = max(1, failure.count)
        key = aggregation_key(failure)
        self.metrics.failures.inc(n)
        if failure.attribution.status in (
            AttributionStatus.UNATTRIBUTED,
            AttributionStatus.HOST,
        ):
            self.metrics.unattributed.inc(n)
        with self._lock:
            pending = self._pending.get(key)
            if pending is not None:
                pending.count += n
                pending.first_seen = min(pending.first_seen, wall)
                pending.last_seen = max(pending.last_seen, wall)
                self.metrics.aggregated.inc(n)
                return
            if self._spooled() >= self.config.spool_size:
                self.metrics.dropped.labels("spool_full").inc(n)
                log.warning(
                    "spool full, dropping failure",
                    extra={"kv": {"path": safe_text(failure.event.path, 256), "count": n}},
                )
                return
            last = self._last_sent.get(key)
            due = now if last is None else max(now, last + self.config.aggregation_window)
            self._pending[key] = _Pending(failure, wall, wall, n, due)
            self._update_gauge()
            self._lock.notify()

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="execwatch-publisher", daemon=True)
        self._thread.start()

    def stop(self, flush_timeout: float = 5.0) -> None:
        """Stop the worker, first trying for `flush_timeout` to send what is spooled."""
        deadline = self.clock() + flush_timeout
        with self._lock:
            for p in self._pending.values():
                p.due = min(p.due, self.clock())
            self._lock.notify()
        while self.spooled() and self.clock() < deadline and self._thread is not None:
            time.sleep(0.05)
        self._stop.set()
        with self._lock:
            self._lock.notify()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def spooled(self) -> int:
        with self._lock:
            return self._spooled()

    def _spooled(self) -> int:
        """Records held: pending, awaiting retry, and the one being sent."""
        return len(self._pending) + len(self._retry) + (self._sending is not None)

    def _update_gauge(self) -> None:
        self.metrics.spool_size.set(self._spooled())

    # -- worker ----------------------------------------------------------------------

    def _next(self) -> tuple[_Sealed | None, float]:
        """The next record to send now, or how long to wait. Called with the lock held."""
        now = self.clock()
        if now < self._retry_at:
            return None, self._retry_at - now
        if self._retry:
            return self._retry.pop(0), 0.0
        due_key, due_at = None, None
        for key, p in self._pending.items():
            if due_at is None or p.due < due_at:
                due_key, due_at = key, p.due
        if due_key is None or due_at is None:
            self._prune(now)
            return None, 1.0
        if due_at > now:
            return None, due_at - now
        p = self._pending.pop(due_key)
        # The window starts when a record is sealed, so a repeat arriving while it is in
        # flight waits for the next window instead of making a second record at once.
        self._last_sent[due_key] = now
        if len(self._last_sent) > 4 * self.config.spool_size:
            self._prune(now)
        self._seq += 1
        name = crd.record_name(self.config.node, self._nonce, self._seq)
        body = crd.to_body(
            p.failure,
            name=name,
            namespace=self.config.namespace,
            node=self.config.node,
            first_seen=p.first_seen,
            last_seen=p.last_seen,
            count=p.count,
        )
        return _Sealed(due_key, body, p.count, p), 0.0

    def _prune(self, now: float) -> None:
        """Forget keys quiet for a full window: they no longer delay anything."""
        window = self.config.aggregation_window
        for key in [k for k, t in self._last_sent.items() if now - t >= window]:
            del self._last_sent[key]

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                sealed, wait = self._next()
                if sealed is None:
                    self._lock.wait(timeout=min(wait, 1.0))
                    continue
                self._sending = sealed
            token_wait = self._bucket.wait_time()
            if token_wait > 0:
                with self._lock:
                    self._retry.insert(0, sealed)
                    self._sending = None
                time.sleep(token_wait)
                continue
            self._bucket.take()
            self._send(sealed)

    def _send(self, sealed: _Sealed) -> None:
        name = sealed.body["metadata"]["name"]
        sealed.attempts += 1
        try:
            self.sink.create(sealed.body)
        except SinkError as err:
            if err.already_exists:
                self._sent(sealed, retried=True)
                return
            self.metrics.api_errors.labels(str(err.status)).inc()
            if err.permanent:
                self.metrics.dropped.labels("rejected").inc(sealed.count)
                log.error("record rejected", extra={"kv": {"record": name, "status": err.status}})
                with self._lock:
                    self._sending = None
                    self._update_gauge()
                return
            with self._lock:
                self._sending = None
                if sealed.attempts == 1:
                    self.metrics.spooled.inc()
                # Once an attempt may have created the record, only its own name may carry
                # these failures: a later definite refusal does not undo that creation.
                sealed.maybe_created |= err.ambiguous
                if sealed.maybe_created:
                    self._retry.append(sealed)
                else:
                    self._unseal(sealed)
                self._backoff = min(
                    self.config.backoff_max,
                    max(self.config.backoff_initial, self._backoff * 2),
                )
                self._retry_at = self.clock() + self._backoff * random.uniform(0.5, 1.0)
                self._update_gauge()
            log.warning(
                "create failed, will retry",
                extra={
                    "kv": {"record": name, "status": err.status, "backoff": round(self._backoff, 2)}
                },
            )
            return
        self._sent(sealed, retried=sealed.attempts > 1)

    def _unseal(self, sealed: _Sealed) -> None:
        """The API server answered that it did not create the record: put its failures
        back with the pending ones of its key, so later repeats keep folding into it
        instead of needing a new spool slot. Called with the lock held."""
        src = sealed.source
        pending = self._pending.get(sealed.key)
        if pending is None:
            self._pending[sealed.key] = src
            src.due = self.clock()
        else:
            pending.count += src.count
            pending.first_seen = min(pending.first_seen, src.first_seen)
            pending.last_seen = max(pending.last_seen, src.last_seen)
            pending.failure = src.failure
            pending.due = self.clock()

    def _sent(self, sealed: _Sealed, retried: bool) -> None:
        with self._lock:
            self._sending = None
            self._backoff = 0.0
            self._retry_at = 0.0
            self._update_gauge()
        self.metrics.published.inc()
        self.metrics.published_failures.inc(sealed.count)
        log.info(
            "record created",
            extra={"kv": {"record": sealed.body["metadata"]["name"], "count": sealed.count}},
        )
