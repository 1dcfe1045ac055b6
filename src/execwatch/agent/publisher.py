"""Agent side: turn ExecFailure values into ExecFailure objects in the API server.

What it guarantees, and how:
- **One create per record, complete.** The object carries everything (`crd.to_body`).
- **A crash loop is not a flood.** Failures with the same key (container, path, reason,
  errno) are folded into one pending record; a key gets at most one record per window.
  The first failure of a key goes out at once (detection stays fast) and opens its
  window of `aggregation_window`; a window that closes with repeats in it sends them as
  one record and doubles, up to `aggregation_window_max`, as the kubelet's
  CrashLoopBackOff does; a key quiet for its whole window starts afresh.
- **Rate limit.** A token bucket bounds creates per second across all keys; what waits
  keeps aggregating.
- **Outages and restarts lose nothing within a bound.** Every record held (pending,
  being sent, awaiting a retry) is written to the node's spool (`agent/spool.py`) by
  the worker thread, and replayed when the agent starts again. At most `spool_size`
  records and `spool_bytes` bytes are held; a failure that would need a new record
  beyond that is dropped and counted (`dropped_total{type="spool_full"}`).
- **A retry never makes a second record.** A record's name is fixed when it is created,
  so re-sending it after a lost answer (or after a restart) gets 409 AlreadyExists,
  which counts as success.
- **Two agents on a node (an upgrade's surge) publish each failure once.** Only the agent
  holding the node's active lock publishes; a new one buffers what its probe sees until
  the old one hands over, then publishes only what came after (`agent/spool.py`).
- **One bad record never blocks the rest.** Each record backs off on its own
  (exponential, with jitter); the worker always sends the record that has been ready
  longest, so a record refused forever waits its turn instead of going first. Only
  errors that say the *server* is unavailable (no answer, 429, 503) also pause the
  others, briefly. A record refused for good (`errors.PermanentError`: 400, 403, 422,
  ...) is retried only while the refusal is younger than `refusal_grace` (an API server
  that has just started answers 403 until its RBAC caches are filled), then dropped and
  counted (`type="rejected"`).

`submit` never blocks on the network or the file system: the probe must keep draining.
"""

from __future__ import annotations

import heapq
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from execwatch import crd
from execwatch.agent.metrics import PublisherMetrics
from execwatch.agent.spool import MAX_COUNT, Handover, Loaded, Spool, StoredRecord
from execwatch.kube import backoff, errors
from execwatch.kube.ratelimit import TokenBucket
from execwatch.record import AttributionStatus, ExecFailed, ExecFailure
from execwatch.text import safe_text

log = logging.getLogger(__name__)

RecordKey = tuple[str, str, str, int]  # container (or pod, cgroup), path, reason, errno


class RecordSink(Protocol):
    """Where records go; the Kubernetes implementation is `agent.records.RecordApi`."""

    def create(self, body: dict[str, Any]) -> None:
        """Create the object; raise an `errors.ApiError` on failure."""


@dataclass(frozen=True)
class PublisherConfig:
    node: str
    namespace: str = crd.DEFAULT_NAMESPACE
    aggregation_window: float = 60.0  # a key's first window
    # The cap of a repeating key's window: the kubelet's longest CrashLoopBackOff.
    aggregation_window_max: float = 300.0
    rate: float = 20.0  # creates per second
    burst: int = 50
    spool_size: int = 2000  # records held: pending, being sent, awaiting retry
    spool_bytes: int = 32 << 20  # their JSON bodies, summed
    backoff_initial: float = 0.5
    backoff_max: float = 30.0
    flush_interval: float = 0.2  # how long a change may wait before it is on disk
    adopt_interval: float = 10.0  # how often to look for spool files of gone agents
    standby_buffer: int = 10000  # failures held while another agent on the node publishes
    # A permanent refusal must last this long before the record is dropped: an API server
    # that has just started answers 403 until its RBAC caches are filled (seen here).
    refusal_grace: float = 30.0

    @property
    def window_cap(self) -> float:
        """How long a repeating key's window may grow: never below the first window."""
        return max(self.aggregation_window, self.aggregation_window_max)


@dataclass(frozen=True)
class _Pace:
    """A key's window: its last record went out at `sent_at` (monotonic), the next one
    may go out `window` seconds later."""

    window: float
    sent_at: float

    @property
    def closes(self) -> float:
        return self.sent_at + self.window


@dataclass
class _Entry:
    """One record held by the publisher. Until `sealed` its body may still change (repeats
    fold into it). It is sealed, on disk first, before each create; a definite refusal
    unseals it again unless an earlier create may have reached the server
    (`maybe_created`): from then on it is only ever re-sent as it is."""

    name: str
    key: RecordKey
    body: dict[str, Any]
    count: int
    first_seen: float
    last_seen: float
    ready_at: float  # monotonic: when it is due (aggregation) or may be retried
    size: int
    attempts: int = 0
    refused_since: float | None = None  # monotonic: first permanent refusal
    grows: bool = False  # holds repeats within its key's window: sending it doubles it
    sealed: bool = False
    maybe_created: bool = False

    def render(self) -> dict[str, Any]:
        spec = self.body["spec"]
        spec["count"] = self.count
        spec["firstSeen"] = crd.rfc3339(self.first_seen)
        spec["lastSeen"] = crd.rfc3339(max(self.first_seen, self.last_seen))
        return self.body

    def stored(self) -> StoredRecord:
        return StoredRecord(
            name=self.name,
            key=json.dumps(self.key),
            body=json.dumps(self.render(), separators=(",", ":")),
            count=self.count,
            first_seen=self.first_seen,
            last_seen=self.last_seen,
            sealed=self.sealed,
        )

    def fold(self, count: int, first_seen: float, last_seen: float) -> None:
        self.count = min(MAX_COUNT, self.count + count)
        self.first_seen = min(self.first_seen, first_seen)
        self.last_seen = max(self.last_seen, last_seen)


def _entry(record: StoredRecord, now: float) -> _Entry:
    key = json.loads(record.key)
    return _Entry(
        name=record.name,
        key=(str(key[0]), str(key[1]), str(key[2]), int(key[3])),
        body=json.loads(record.body),
        count=record.count,
        first_seen=record.first_seen,
        last_seen=record.last_seen,
        ready_at=now,
        size=len(record.body),
        sealed=record.sealed,
        maybe_created=record.sealed,
    )


def record_key(failure: ExecFailure) -> RecordKey:
    """The key repeats fold into one record by: failures that are 'the same' for an
    administrator (one container, one path, one reason and errno). Not the node's
    `record.RepeatKey`, which folds raw kernel records before their diagnosis."""
    a = failure.attribution
    who = a.container_id or a.pod_uid or a.cgroup_path or f"cgroup:{failure.event.cgroup_id}"
    e = failure.event
    return (who, e.path, str(failure.diagnosis.reason), e.errno if isinstance(e, ExecFailed) else 0)


@dataclass
class Publisher:
    """Aggregates, rate-limits, spools and creates records; one worker thread.

    With `spool` (a `agent.spool.Spool`) what it holds survives a restart; without, the
    spool is memory only."""

    config: PublisherConfig
    sink: RecordSink
    metrics: PublisherMetrics = field(default_factory=PublisherMetrics)
    spool: Spool | None = None
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time

    def __post_init__(self) -> None:
        self._lock = threading.Condition()
        self._entries: dict[str, _Entry] = {}
        self._open: dict[RecordKey, str] = {}  # the entry of each key that repeats fold into
        self._ready: list[tuple[float, int, str]] = []  # heap: (ready_at, seq, name)
        self._sending: str | None = None
        self._bytes = 0
        self._paces: dict[RecordKey, _Pace] = {}
        self._dirty: set[str] = set()
        self._gone: set[str] = set()
        self._bucket = TokenBucket(self.config.rate, self.config.burst, self.clock)
        self._nonce = os.urandom(6).hex()
        self._seq = 0
        self._server_failures = 0  # in a row: the server's own backoff
        self._server_retry_at = 0.0
        self._next_flush = 0.0
        self._next_adopt = 0.0
        self._handover = Handover(
            self.spool, self._accept, self.metrics, self.config.standby_buffer
        )
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- producer side ---------------------------------------------------------------

    def submit(self, failure: ExecFailure) -> None:
        """Take one failure (or a pre-folded run of them); never blocks on I/O. While
        another agent publishes on the node it is held (`spool.Handover`)."""
        self._handover.submit(failure)

    def _accept(self, failure: ExecFailure) -> None:
        now, wall = self.clock(), failure.event.time or self.wall()
        n = max(1, failure.count)
        key = record_key(failure)
        self.metrics.failures.inc(n)
        if failure.attribution.status in (
            AttributionStatus.UNATTRIBUTED,
            AttributionStatus.HOST,
        ):
            self.metrics.unattributed.inc(n)
        with self._lock:
            name = self._open.get(key)
            if name is not None:
                self._entries[name].fold(n, wall, wall)
                self._dirty.add(name)
                self.metrics.aggregated.inc(n)
                return
            pace = self._paces.get(key)
            grows = pace is not None and now < pace.closes  # else: quiet, start afresh
            due = pace.closes if pace is not None and grows else now
            self._seq += 1
            name = crd.record_name(self.config.node, self._nonce, self._seq)
            body = crd.to_body(
                failure,
                name=name,
                namespace=self.config.namespace,
                node=self.config.node,
                first_seen=wall,
                last_seen=wall,
                count=n,
            )
            entry = _Entry(name, key, body, n, wall, wall, due, size=len(json.dumps(body)))
            entry.grows = grows
            if not self._admit(entry):
                self.metrics.dropped.labels("spool_full").inc(n)
                log.warning(
                    "spool full, dropping failure",
                    extra={"kv": {"path": safe_text(failure.event.path, 256), "count": n}},
                )
                return
            self._open[key] = name
            self._lock.notify()

    def _admit(self, entry: _Entry) -> bool:
        """Hold `entry` if the bounds allow. Called with the lock held."""
        if (
            len(self._entries) >= self.config.spool_size
            or self._bytes + entry.size > self.config.spool_bytes
        ):
            return False
        self._entries[entry.name] = entry
        self._bytes += entry.size
        self._dirty.add(entry.name)
        self._schedule(entry)
        self._update_gauges()
        return True

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        """Replay the spool (records of a previous run of this agent, or of an agent that
        is gone), then start the worker."""
        if self.spool is not None:
            self._replay(self.spool)
        self._handover.start()
        self._thread = threading.Thread(target=self._run, name="execwatch-publisher", daemon=True)
        self._thread.start()

    def stop(self, flush_timeout: float = 5.0, handover_at: float | None = None) -> None:
        """Try for `flush_timeout` to send what is held, then stop; what is left stays in
        the spool for the next start. `handover_at`: the CLOCK_BOOTTIME up to which the
        probe's events were all submitted, for the agent that publishes next on this
        node. Idempotent."""
        if self._stop.is_set():
            return
        deadline = self.clock() + flush_timeout
        with self._lock:
            now = self.clock()
            for entry in self._entries.values():
                if entry.attempts == 0 and entry.ready_at > now:
                    entry.ready_at = now
                    self._schedule(entry)
            self._lock.notify()
        while self.spooled() and self.clock() < deadline and self._thread is not None:
            time.sleep(0.05)
        self._stop.set()
        self._handover.stop()  # what it held, the active agent saw
        with self._lock:
            self._lock.notify()
        if self._thread is not None:
            self._thread.join(timeout=15)
        if self.spool is not None:
            self._flush()
            self._handover.hand_over(handover_at)
            self.spool.close()

    def spooled(self) -> int:
        """Records held: pending, awaiting a retry, and the one being sent."""
        with self._lock:
            return len(self._entries)

    def _update_gauges(self) -> None:
        self.metrics.spool_size.set(len(self._entries))
        self.metrics.spool_bytes.set(self._bytes)

    def _schedule(self, entry: _Entry) -> None:
        heapq.heappush(self._ready, (entry.ready_at, self._tiebreak(), entry.name))

    def _tiebreak(self) -> int:
        self._seq += 1
        return self._seq

    # -- the spool on disk -----------------------------------------------------------

    def _replay(self, spool: Spool) -> None:
        loaded = spool.load()
        self._take_over(loaded)
        if loaded.records or loaded.corrupt:
            log.info(
                "spool replayed",
                extra={
                    "kv": {
                        "records": len(loaded.records),
                        "corrupt": loaded.corrupt,
                        "adopted_files": loaded.files,
                    }
                },
            )

    def _take_over(self, loaded: Loaded) -> None:
        """Hold records read from disk (this agent's, or adopted) as if just submitted."""
        if loaded.corrupt:
            self.metrics.dropped.labels("corrupt").inc(loaded.corrupt)
        now = self.clock()
        with self._lock:
            for record in loaded.records:
                entry = _entry(record, now)
                if entry.name in self._entries:
                    continue
                if not self._admit(entry):
                    self.metrics.dropped.labels("spool_full").inc(entry.count)
                    self._gone.add(entry.name)
                    continue
                self._dirty.discard(entry.name)  # it is on disk already
                self.metrics.replayed.inc()
                if not entry.sealed and entry.key not in self._open:
                    self._open[entry.key] = entry.name
            self._lock.notify()

    def _flush(self) -> None:
        """Write what changed since the last flush, in one transaction."""
        if self.spool is None:
            return
        with self._lock:
            upserts = [self._entries[n].stored() for n in self._dirty if n in self._entries]
            deletes = list(self._gone)
            self._dirty.clear()
            self._gone.clear()
        try:
            self.spool.write(upserts, deletes)
        except Exception as exc:  # a full or failing disk: keep going from memory
            self.metrics.spool_errors.inc()
            log.error("spool write failed", extra={"kv": {"error": str(exc)}})
            with self._lock:
                self._dirty.update(r.name for r in upserts)
                self._gone.update(deletes)

    def _adopt(self) -> None:
        """Take over the spool files of agents that are gone (the old pod of a surge)."""
        if self.spool is None:
            return
        try:
            loaded = self.spool.adopt()
        except Exception as exc:
            self.metrics.spool_errors.inc()
            log.error("spool adoption failed", extra={"kv": {"error": str(exc)}})
            return
        if loaded.files:
            self._take_over(loaded)

    # -- worker ----------------------------------------------------------------------

    def _next(self) -> tuple[_Entry | None, float]:
        """The record that has been ready longest, or how long to wait. Lock held."""
        now = self.clock()
        if now < self._server_retry_at:
            return None, self._server_retry_at - now
        while self._ready:
            ready_at, _, name = self._ready[0]
            entry = self._entries.get(name)
            if entry is None or entry.ready_at != ready_at or name == self._sending:
                heapq.heappop(self._ready)  # stale: rescheduled, sent or dropped
                continue
            if ready_at > now:
                return None, ready_at - now
            heapq.heappop(self._ready)
            return entry, 0.0
        self._prune(now)
        return None, 1.0

    def _prune(self, now: float) -> None:
        """Forget keys quiet for their whole window: they start afresh. Lock held."""
        quiet = [k for k, p in self._paces.items() if now >= p.closes and k not in self._open]
        for key in quiet:
            del self._paces[key]

    def _run(self) -> None:
        while not self._stop.is_set():
            now = self.clock()
            if now >= self._next_adopt:
                self._next_adopt = now + self.config.adopt_interval
                self._adopt()
            if now >= self._next_flush:
                self._next_flush = now + self.config.flush_interval
                self._flush()
            with self._lock:
                entry, wait = self._next()
                if entry is None:
                    self._lock.wait(timeout=min(wait, self.config.flush_interval))
                    continue
                token_wait = self._bucket.wait_time()
                if token_wait > 0:
                    entry.ready_at = self.clock() + token_wait
                    self._schedule(entry)
                    continue
                self._bucket.take()
                self._sending = entry.name
                self._close_window(entry)
                entry.render()
                entry.sealed = True
                self._dirty.add(entry.name)
            self._flush()  # the record is on disk, under its name, before it is sent
            self._send(entry)

    def _close_window(self, entry: _Entry) -> None:
        """Repeats of its key now go to a new record, due a window after this one was
        first sent (not after a retry): twice the last window if this record held repeats
        within it (up to the cap), else the first window. Lock held."""
        if self._open.get(entry.key) == entry.name:
            del self._open[entry.key]
            if entry.attempts == 0:
                now, cfg = self.clock(), self.config
                pace = self._paces.get(entry.key)
                window = cfg.aggregation_window
                if entry.grows and pace is not None:
                    window = min(cfg.window_cap, 2 * pace.window)
                self._paces[entry.key] = _Pace(window, now)
                if len(self._paces) > 4 * cfg.spool_size:
                    self._prune(now)

    def _send(self, entry: _Entry) -> None:
        entry.attempts += 1
        try:
            self.sink.create(entry.body)
        except errors.ConflictError as err:
            if err.reason != "AlreadyExists":  # no other 409 says the record was made
                self._failed(entry, errors.RetryableError(409, err.reason, err.message))
                return
            self._done(entry, published=True)
        except errors.ApiError as err:
            self._failed(entry, err)
        except Exception as exc:  # a client bug must not end the one thread that publishes
            log.exception(
                "unexpected error creating a record", extra={"kv": {"record": entry.name}}
            )
            self._failed(entry, errors.RetryableError(0, type(exc).__name__, str(exc)[:256]))
        else:
            self._done(entry, published=True)

    def _done(self, entry: _Entry, *, published: bool) -> None:
        with self._lock:
            self._sending = None
            if self._entries.pop(entry.name, None) is not None:
                self._bytes -= entry.size
            if self._open.get(entry.key) == entry.name:
                del self._open[entry.key]
            self._dirty.discard(entry.name)
            self._gone.add(entry.name)
            self._server_failures = 0
            self._server_retry_at = 0.0
            self._update_gauges()
        if published:
            self.metrics.published.inc()
            self.metrics.published_failures.inc(entry.count)
            log.info("record created", extra={"kv": {"record": entry.name, "count": entry.count}})

    def _failed(self, entry: _Entry, err: errors.ApiError) -> None:
        self.metrics.api_errors.labels(_code_label(err.status)).inc()
        refused = isinstance(err, errors.PermanentError)
        if refused and entry.refused_since is None:
            entry.refused_since = self.clock()
        if refused and self.clock() - (entry.refused_since or 0.0) >= self.config.refusal_grace:
            self.metrics.dropped.labels("rejected").inc(entry.count)
            log.error(
                "record rejected",
                extra={"kv": {"record": entry.name, "message": err.message, **errors.as_dict(err)}},
            )
            self._done(entry, published=False)
            return
        cfg = self.config
        with self._lock:
            self._sending = None
            if entry.attempts == 1:
                self.metrics.spooled.inc()
            entry.maybe_created = entry.maybe_created or err.may_have_acted
            entry.sealed = entry.maybe_created
            if not refused:  # a refused record takes in no new failures
                self._reopen(entry)
            delay = errors.delay(
                err, backoff.delay(entry.attempts, cfg.backoff_initial, cfg.backoff_max)
            )
            entry.ready_at = self.clock() + delay
            self._schedule(entry)
            self._dirty.add(entry.name)
            if err.status in (0, 429, 503):  # the server, not this record: pause everyone
                self._server_failures += 1
                self._server_retry_at = self.clock() + errors.delay(
                    err, backoff.delay(self._server_failures, cfg.backoff_initial, cfg.backoff_max)
                )
            else:
                self._server_failures = 0
                self._server_retry_at = 0.0
        log.warning(
            "create failed, will retry",
            extra={"kv": {"record": entry.name, "status": err.status, "retry_in": round(delay, 2)}},
        )

    def _reopen(self, entry: _Entry) -> None:
        """The server said it did not create the record: let later repeats of its key
        fold into it again instead of taking a new spool slot. Lock held."""
        if entry.sealed:
            return
        other = self._open.get(entry.key)
        if other is not None and other != entry.name:
            newer = self._entries.pop(other)
            self._bytes -= newer.size
            self._gone.add(newer.name)
            self._dirty.discard(newer.name)
            entry.fold(newer.count, newer.first_seen, newer.last_seen)
        self._open[entry.key] = entry.name
        self._update_gauges()


_CODES = frozenset({0, 400, 401, 403, 404, 408, 409, 413, 422, 429, 500, 502, 503, 504})


def _code_label(status: int) -> str:
    """A bounded label: a proxy inventing statuses cannot create series."""
    return str(status) if status in _CODES else "other"
