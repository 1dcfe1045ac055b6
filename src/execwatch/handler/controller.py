"""Handler side: consume ExecFailure records, act on pods, count, delete.

Only the Lease holder works: `watcher.py` lists and watches records into the work queue
(`workqueue.py`), worker threads handle them here, `pods.py` and `pod_events.py` make the API
calls, through `rest.py`, every failure classified by `errors.py`.

For each record, in this order:
1. validate it completely (`crd.parse`, times included); a bad one is deleted and
   counted as invalid, never retried;
2. check the pod it names (`pods.py`): it must exist with the recorded UID and run on
   the reporting node, which admission has bound to the agent's own node. A pod that is
   gone, or on another node, is not believed: such a record is counted as unattributed
   (pod gone) or invalid (another node), never with the namespace or workload it claims;
3. fold it into the pod's Warning Event series (idempotent: see pod_events.py);
4. label the pod with a merge patch (skipped when the label already says so, and when
   another admission webhook or RBAC refuses it: permanent errors are not retried);
5. delete the record with a UID precondition; the delete that removes it counts it.

With a `hook` (placement's feedback, placement/observed.py, injected by the handler
command), each counted record is also offered to it: a bounded queue and a thread of its
own, never waited on here.

Exactly once: only one delete of a record can remove it. A delete whose answer is lost
(no answer, 500, 504) may have removed it: the record is remembered as "unsure" and
resolved by whatever comes first, the watch's DELETED event, the retried delete's 404,
or, when leadership ends, a delete sent again before any other replica can lead (a list
could not tell: the lost delete may still be on its way). The one that resolves it counts
it. A crash
between 3 and 5 leaves the record; the next leader redoes 3 (a no-op), 4 (a no-op), 5.
A record that keeps failing for a reason that is not the API's (a bug, a value the
schema allows but nothing can use) is counted as invalid after `max_attempts`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from cachetools import FIFOCache
from prometheus_client import CollectorRegistry

from execwatch import crd
from execwatch.handler.metrics import HandlerMetrics
from execwatch.handler.pod_events import DuplicateRecord, EventConflict, EventWriter, event_reason
from execwatch.handler.pods import LABEL, Pod, PodReader, workload_of
from execwatch.kube import errors
from execwatch.kube.client import Rest
from execwatch.kube.lease import LeaseConfig, LeaseElector
from execwatch.kube.watch import QueueSink, WatchConfig, Watcher
from execwatch.kube.workqueue import WorkQueue
from execwatch.record import Reason

log = logging.getLogger(__name__)

MIN_DELETE_BUDGET = 0.05  # seconds: below this a delete would only time out
RESOLVE_PAUSE = 0.05  # seconds between deletes of one unsure record at failover

__all__ = ["LABEL", "Handler", "HandlerConfig", "HookFactory", "RecordHook", "Retry", "workload_of"]

RECENT_RECORDS = 8192  # records handled whose later sightings are stale


@dataclass(frozen=True)
class HandlerConfig:
    identity: str
    namespace: str = crd.DEFAULT_NAMESPACE
    lease_name: str = "execwatch-handler"
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    label_pods: bool = True
    watch_timeout: int = 300  # seconds; the server ends each watch after this
    resync_period: float = 300.0
    request_timeout: float = 10.0
    retry_initial: float = 0.5
    retry_max: float = 30.0
    workers: int = 16  # records handled in parallel (API round trips dominate)
    list_page: int = 50  # records per list call: a page stays small in a 256 Mi pod
    max_attempts: int = 8  # failures not due to the API before a record counts as invalid


class RecordHook(Protocol):
    """Offered each counted record once, from a worker: never waits (placement's feedback,
    placement/observed.py). Started and stopped with the handler."""

    def offer(self, rec: crd.ParsedRecord) -> None: ...
    def start(self) -> None: ...
    def stop(self) -> None: ...
    def idle(self) -> bool: ...


# Builds the hook once the handler's client and registry exist: (client, registry, wall).
HookFactory = Callable[[Rest, CollectorRegistry, Callable[[], float]], RecordHook]


class Retry(Exception):
    """The record could not be handled now (API trouble, lost leadership); try later."""

    def __init__(self, why: str, error: errors.ApiError | None = None) -> None:
        super().__init__(why)
        self.error = error


@dataclass
class _Unsure:
    """A record some delete of which may have removed it, and how to count it once."""

    count: Callable[[], None]
    sent: int = 0  # deletes of it not answered yet
    maybe_done: bool = False  # one of them got no definite answer


@dataclass
class Handler:
    """One handler replica: elector + (while leading) watcher and worker threads."""

    config: HandlerConfig
    kube: Any  # lightkube's KubeConfig: server, CA and credentials (`rest.load_config`)
    metrics: HandlerMetrics = field(default_factory=HandlerMetrics)
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    hook: HookFactory | None = None

    def __post_init__(self) -> None:
        cfg = self.config
        # One pooled connection per worker, the watch and the Lease: a smaller pool throws
        # connections away and pays a TLS handshake per request.
        self.rest = Rest(self.kube, timeout=cfg.request_timeout, pool=cfg.workers + 4)
        self.queue = WorkQueue(clock=self.clock)
        self.pods = PodReader(self.rest)
        self.events = EventWriter(self.rest, cfg.identity, clock=self.wall)
        self.watcher = Watcher(
            WatchConfig(
                namespace=cfg.namespace,
                resource=crd.records_path(cfg.namespace),
                watch_timeout=cfg.watch_timeout,
                resync_period=cfg.resync_period,
                request_timeout=cfg.request_timeout,
                retry_initial=cfg.retry_initial,
                retry_max=cfg.retry_max,
                list_page=cfg.list_page,
            ),
            self.rest,
            QueueSink(self.queue, self._deleted),
            self.metrics,
            clock=self.clock,
        )
        self.elector = LeaseElector(
            LeaseConfig(
                namespace=cfg.namespace,
                name=cfg.lease_name,
                identity=cfg.identity,
                lease_duration=cfg.lease_duration,
                renew_deadline=cfg.renew_deadline,
                retry_period=cfg.retry_period,
                request_timeout=min(cfg.request_timeout, cfg.retry_period * 2),
            ),
            self.rest,
            on_change=self._on_leader_change,
            clock=self.clock,
        )
        self._stop = threading.Event()
        self._term: threading.Event = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._recent: FIFOCache[str, str] = FIFOCache(RECENT_RECORDS)  # name -> uid, handled
        # (record name, uid) -> how to count it once its removal is known
        self._unsure: dict[tuple[str, str], _Unsure] = {}
        self._term_threads: list[threading.Thread] = []
        self._busy = 0
        self.handled = 0
        self.feedback: RecordHook | None = None
        if self.hook is not None:
            self.feedback = self.hook(self.rest, self.metrics.registry, self.wall)

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        if self.feedback is not None:
            self.feedback.start()
        t = threading.Thread(
            target=self.elector.run, args=(self._stop,), name="execwatch-lease", daemon=True
        )
        t.start()
        self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        self._term.set()
        self.watcher.interrupt()
        for t in self._threads:
            t.join(timeout=10)
        if self.feedback is not None:
            self.feedback.stop()

    def idle(self) -> bool:
        """Nothing queued, being handled or unsure (tests and benchmarks wait on it)."""
        with self._lock:
            busy = self._busy + len(self._unsure)
        feedback = self.feedback is None or self.feedback.idle()
        return busy == 0 and len(self.queue) == 0 and feedback

    def _on_leader_change(self, leading: bool) -> None:
        self.metrics.leader.set(1 if leading else 0)
        self._threads = [t for t in self._threads if t.is_alive()]
        if leading:
            self._term = threading.Event()
            self.queue.clear()
            loops: list[tuple[Callable[[threading.Event], None], str]] = [
                (self.watcher.run, "watch")
            ]
            loops += [(self._work_loop, f"work-{i}") for i in range(self.config.workers)]
            self._term_threads = []
            for target, name in loops:
                t = threading.Thread(
                    target=target, args=(self._term,), name=f"execwatch-{name}", daemon=True
                )
                t.start()
                self._term_threads.append(t)
                self._threads.append(t)
        else:
            self._term.set()
            self.watcher.interrupt()
            # Before the Lease is released or can expire: let the in-flight calls end,
            # then settle the deletes whose answers were lost.
            for t in self._term_threads:
                t.join(timeout=max(0.0, self.elector.sole_time_left() - self._reserve()))
            self.queue.clear()
            self._resolve_unsure()

    # -- working ---------------------------------------------------------------------

    def _work_loop(self, term: threading.Event) -> None:
        while not term.is_set():
            obj = self.queue.get(timeout=0.5)
            if obj is None:
                continue
            name = str(obj["metadata"]["name"])
            with self._lock:
                self._busy += 1
            try:
                self.handle(obj)
                self.queue.done(name)
            except Retry as exc:
                if not term.is_set():
                    self._retry(obj, name, str(exc), exc.error)
            except Exception:
                log.exception("unexpected error handling record", extra={"kv": {"record": name}})
                if self.queue.failures(name) + 1 >= self.config.max_attempts:
                    self._give_up(obj)
                elif not term.is_set():
                    self._retry(obj, name, "unexpected error", None)
            finally:
                with self._lock:
                    self._busy -= 1

    def _retry(self, obj: dict[str, Any], name: str, why: str, err: errors.ApiError | None) -> None:
        delay = self.queue.retry_delay(name, self.config.retry_initial, self.config.retry_max)
        if err is not None:
            delay = errors.delay(err, delay)
        log.info(
            "will retry record",
            extra={"kv": {"record": name, "why": why, "delay": round(delay, 2)}},
        )
        self.queue.add(obj, delay=delay)

    def _give_up(self, obj: dict[str, Any]) -> None:
        """A record no code path can finish: counted as invalid once, so it never sits
        in the queue (and the quota) forever."""
        meta = obj.get("metadata") or {}
        name, uid = str(meta.get("name", "")), str(meta.get("uid", ""))
        try:
            self._finish(name, uid, lambda: self._invalid("unprocessable", None))
        except Retry as exc:
            self._retry(obj, name, str(exc), exc.error)
        else:
            self.queue.done(name)

    def _fence(self) -> None:
        if not self.elector.is_leader():
            raise Retry("not the leader")

    def handle(self, obj: dict[str, Any]) -> None:
        """Handle one record completely, or raise Retry leaving it in place."""
        meta = obj.get("metadata") or {}
        name, uid = str(meta.get("name", "")), str(meta.get("uid", ""))
        try:
            rec = crd.parse(obj)
        except crd.InvalidRecord as bad:
            log.warning("invalid record", extra={"kv": {"record": name, "why": str(bad)}})
            kind = bad.kind
            self._finish(name, uid, lambda: self._invalid(kind, None))
            return
        self._settle_replaced(rec.name, rec.uid)
        with self._lock:
            seen_uid = self._recent.get(rec.name, "")
        if seen_uid == rec.uid:
            return  # a stale retry of a record already removed and counted
        if seen_uid:
            # An agent re-created a record we already handled (its create answer was lost).
            self._finish_duplicate(rec)
            return
        if not rec.names_pod:
            self._finish(rec.name, rec.uid, lambda: self._unattributed(rec, "no_pod"))
            return
        try:
            pod = self._pod(rec)
        except crd.InvalidRecord as bad:
            kind = bad.kind
            self._finish(rec.name, rec.uid, lambda: self._invalid(kind, rec))
            return
        if pod is None:
            # Gone, or re-created under the same name: the failure happened on the
            # reporting node, but which namespace and workload is only the record's word.
            self._finish(rec.name, rec.uid, lambda: self._unattributed(rec, "pod_missing"))
            return
        if pod.node != rec.node:
            log.warning(
                "record names a pod on another node",
                extra={
                    "kv": {
                        "record": rec.name,
                        "node": rec.node,
                        "pod": f"{pod.namespace}/{pod.name}",
                    }
                },
            )
            self._finish(rec.name, rec.uid, lambda: self._invalid("node_mismatch", rec))
            return
        self._fence()
        if not self._post_event(rec, pod):
            return
        if self.config.label_pods:
            self._label(rec, pod)
        self._finish(rec.name, rec.uid, lambda: self._counted(rec, pod))

    # -- outcomes (each runs once per record, for the delete that removed it) ----------

    def _counted(self, rec: crd.ParsedRecord, pod: Pod) -> None:
        labels: dict[str, str | None] = {
            "namespace": pod.namespace,
            "workload": pod.workload or pod.name,
            "container": rec.container if rec.container in pod.containers else "",
            "node": pod.node,
            "node_arch": rec.node_arch,
            "binary_arch": rec.binary_arch,
            "reason": str(rec.reason),
            "pod": pod.name,
        }
        self.metrics.count_failures(labels, rec.count)
        self.metrics.latency.observe(max(0.0, self.wall() - rec.last_seen))
        if self.feedback is not None:
            self.feedback.offer(rec)
        self._done(rec, "handled")

    def _unattributed(self, rec: crd.ParsedRecord, cause: str) -> None:
        self.metrics.count_unattributed(rec.node, rec.node_arch, str(rec.reason), cause, rec.count)
        self._done(rec, "pod_missing" if cause == "pod_missing" else "unattributed")

    def _invalid(self, kind: str, rec: crd.ParsedRecord | None) -> None:
        self.metrics.invalid.labels(kind).inc()
        self.metrics.records.labels("invalid").inc()
        if rec is not None:
            self._remember()

    def _done(self, rec: crd.ParsedRecord, result: str) -> None:
        self.metrics.records.labels(result).inc()
        self._remember()
        log.info(
            "record handled",
            extra={
                "kv": {
                    "record": rec.name,
                    "result": result,
                    "reason": str(rec.reason),
                    "pod": f"{rec.namespace}/{rec.pod}",
                    "count": rec.count,
                }
            },
        )

    def _remember(self) -> None:
        with self._lock:
            self.handled += 1

    def _mark_removed(self, name: str, uid: str) -> None:
        """Called with the lock held, by whoever is about to count a record: later
        sightings of this name/uid are stale, another uid is an agent's re-creation."""
        self._unsure.pop((name, uid), None)
        self._recent[name] = uid

    def _finish_duplicate(self, rec: crd.ParsedRecord) -> None:
        def duplicate() -> None:
            self.metrics.records.labels("duplicate").inc()
            log.info(
                "duplicate record deleted without counting", extra={"kv": {"record": rec.name}}
            )

        self._finish(rec.name, rec.uid, duplicate)

    # -- API steps ---------------------------------------------------------------------

    def _pod(self, rec: crd.ParsedRecord) -> Pod | None:
        self._fence()
        try:
            return self.pods.get(rec.namespace, rec.pod, rec.pod_uid)
        except errors.PermanentError as err:
            self.metrics.api_errors.labels("get_pod", errors.code(err)).inc()
            raise crd.InvalidRecord("pod_forbidden", f"cannot read pod: {err.status}") from None
        except errors.ApiError as err:
            self.metrics.api_errors.labels("get_pod", errors.code(err)).inc()
            raise Retry(f"get pod: {err}", err) from None

    def _post_event(self, rec: crd.ParsedRecord, pod: Pod) -> bool:
        """Fold the record into its Event series; False if the record turned out to be a
        duplicate (and was finished as one)."""
        known = rec.container in pod.containers
        container_path = f"spec.containers{{{rec.container}}}" if known else None
        try:
            self.events.record(rec, pod, container_path)
        except DuplicateRecord:
            self._finish_duplicate(rec)
            return False
        except EventConflict as exc:
            raise Retry(f"event: {exc}") from None
        except errors.NotFoundError as err:
            self._skip_gone("event", rec, pod, err)
        except errors.ApiError as err:
            self._skip_if_refused("event", rec, err)
        return True

    def _label(self, rec: crd.ParsedRecord, pod: Pod) -> None:
        if rec.reason in (Reason.UNDIAGNOSED, Reason.EMULATED) and pod.label:
            # An earlier failure already named its cause: keep it. A crash-looping
            # container can be gone, rootfs and all, before its next failure is diagnosed,
            # and an emulated exec that ran is no news next to one that failed.
            return
        self._fence()
        try:
            self.pods.label(pod, event_reason(rec.reason))
        except (errors.NotFoundError, errors.ConflictError):
            self.pods.forget(pod)  # gone or replaced since it was read: the Event is enough
        except errors.ApiError as err:
            self._skip_if_refused("label_pod", rec, err)

    def _skip_gone(self, verb: str, rec: crd.ParsedRecord, pod: Pod, err: errors.ApiError) -> None:
        """The pod's namespace is gone (an Event cannot be created in it, ever again): the
        failure still happened and is counted; retrying would only be refused again."""
        self.metrics.api_errors.labels(verb, errors.code(err)).inc()
        self.pods.forget(pod)
        log.warning(f"{verb} skipped: namespace gone", extra={"kv": {"record": rec.name}})

    def _skip_if_refused(self, verb: str, rec: crd.ParsedRecord, err: errors.ApiError) -> None:
        """The Event and the label are extras: a permanent refusal (400/403/422 from
        validation, RBAC or another admission webhook) skips the step and the failure is
        still counted, since retrying would only be refused again. Anything else: retry."""
        self.metrics.api_errors.labels(verb, errors.code(err)).inc()
        if not isinstance(err, errors.PermanentError):
            raise Retry(f"{verb}: {err}", err) from None
        log.warning(f"{verb} refused", extra={"kv": {"record": rec.name, **errors.as_dict(err)}})

    def _finish(self, name: str, uid: str, outcome: Callable[[], None]) -> None:
        """Delete the record (UID precondition) and run `outcome` exactly once, for the
        delete that removed it, whoever learns of the removal first.

        The record is "unsure" from before the request is sent until a definite answer:
        the watch's DELETED for this delete may arrive before the delete's own answer, or
        instead of it when that answer is lost; `_settle` then counts it."""
        self._fence()
        timeout = self._delete_budget()
        if timeout is None:
            raise Retry("the Lease window left is too short for a delete")
        with self._lock:
            if self._recent.get(name) == uid:
                return  # counted already: a stale retry
            unsure = self._unsure.setdefault((name, uid), _Unsure(outcome))
            unsure.sent += 1
        try:
            self._delete(name, uid, timeout)
        except errors.ApiError as err:
            self.metrics.api_errors.labels("delete", errors.code(err)).inc()
            with self._lock:
                unsure.sent -= 1
                unsure.maybe_done |= err.may_have_acted
                if not (unsure.sent or unsure.maybe_done):  # every delete a definite "no"
                    self._unsure.pop((name, uid), None)
            raise Retry(f"delete: {err}", err) from None
        self._settle(name, uid)

    def _delete(self, name: str, uid: str, timeout: float) -> None:
        """Delete the record with a UID precondition. Returns when it is gone: removed now,
        or already (404), or replaced by a new record of that name (409). Only the replica
        in its sole-actor window deletes records, so "gone" means our own delete did it,
        this one or an earlier one whose answer was lost."""
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": uid}}
        with contextlib.suppress(errors.NotFoundError, errors.ConflictError):
            self.rest.call(
                "DELETE", crd.records_path(self.config.namespace, name), body=body, timeout=timeout
            )

    def _reserve(self) -> float:
        """The end of the sole-actor window kept for settling lost delete answers
        (`_resolve_unsure`): every delete of the working loop ends before it."""
        return self.config.lease_duration - self.config.renew_deadline

    def _delete_budget(self) -> float | None:
        """A delete's timeout: never past the start of the reserve (None: no time left)."""
        left = self.elector.sole_time_left() - self._reserve()
        return min(self.config.request_timeout, left) if left >= MIN_DELETE_BUDGET else None

    def _settle(self, name: str, uid: str) -> None:
        """The record `name`/`uid` is gone: count it if our delete may have removed it."""
        with self._lock:
            unsure = self._unsure.get((name, uid))
            if unsure is None:
                return
            self._mark_removed(name, uid)
        unsure.count()

    def _settle_replaced(self, name: str, uid: str) -> None:
        """A record `name` with a new `uid` exists: an unsure one of that name is gone (the
        queue keeps only the newest object of a name, so its retry would never come)."""
        with self._lock:
            replaced = [u for n, u in self._unsure if n == name and u != uid]
        for old in replaced:
            self._settle(name, old)

    def _deleted(self, name: str, uid: str) -> None:
        self._settle(name, uid)

    def _resolve_unsure(self) -> None:
        """Delete each unsure record again, all at once, while no other replica can have
        taken the Lease: gone or removed now, it was ours to count. A list by name would
        not do: a lost delete can still be on its way, and remove the record after the
        list saw it. What the window does not settle is reported unresolved."""
        while self.elector.sole_actor():
            with self._lock:
                pending = list(self._unsure)
            if not pending:
                return
            with ThreadPoolExecutor(
                min(len(pending), self.config.workers), thread_name_prefix="execwatch-resolve"
            ) as pool:
                for name, uid in pending:
                    pool.submit(self._resolve_one, name, uid)
        with self._lock:
            left = sorted(name for name, _ in self._unsure)
            self._unsure.clear()
        if left:
            self.metrics.records.labels("unresolved").inc(len(left))
            log.error(
                "records left unresolved at failover",
                extra={"kv": {"count": len(left), "records": left[:16]}},
            )

    def _resolve_one(self, name: str, uid: str) -> None:
        while (left := self.elector.sole_time_left()) > 0:
            try:
                self._delete(name, uid, min(self.config.request_timeout, left))
            except errors.ApiError as err:
                self.metrics.api_errors.labels("delete", errors.code(err)).inc()
                time.sleep(min(RESOLVE_PAUSE, max(0.0, left)))
                continue
            self._settle(name, uid)
            return
