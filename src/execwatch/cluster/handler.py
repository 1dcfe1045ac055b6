"""Handler side: consume ExecFailure records, act on pods, count, delete.

Only the Lease holder works. For each record, in this order:
1. validate it (`crd.parse`); a bad one is deleted and counted as invalid;
2. read the pod it names: it must exist with the recorded UID and run on the reporting
   node (an agent may only speak for its own node, so a compromised node cannot label or
   post Events on pods elsewhere);
3. fold it into the pod's Warning Event series (idempotent: see events.py);
4. label the pod with a merge patch (skipped when the label already says so);
5. delete the record with a UID precondition, and only if THAT delete succeeds add its
   count to `execwatch_exec_failures_total`.
Step 5 makes counting exactly-once per record even with two replicas briefly believing
they lead: only one delete can succeed. A crash between 3 and 5 leaves the record in
place; the next leader redoes 3 (a no-op), 4 (a no-op) and 5.

Records arrive by list+watch into a de-duplicating work queue (client-go's pattern). A
watch broken by an API server restart resumes from the last resourceVersion; if that is
too old (410 Gone) the handler re-lists. Records are deleted once handled, so a re-list
sees exactly the unhandled ones: nothing is lost.
"""

from __future__ import annotations

import contextlib
import heapq
import json
import logging
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from execwatch.attribution.metadata import workload_from_owner
from execwatch.cluster import crd, errors
from execwatch.cluster.events import DuplicateRecord, EventWriter, event_reason
from execwatch.cluster.lease import LeaseConfig, LeaseElector
from execwatch.cluster.metrics import HandlerMetrics

log = logging.getLogger(__name__)

LABEL = "execwatch.io/exec-failure"


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
    workers: int = 4  # records handled in parallel (API round trips dominate)
    list_page: int = 500


class Retry(Exception):
    """The record could not be handled now (API trouble, lost leadership); try later."""

    def __init__(self, why: str, error: errors.ApiError | None = None) -> None:
        super().__init__(why)
        self.error = error


@dataclass
class WorkQueue:
    """Record names to handle, de-duplicated, with per-item delays for retries."""

    clock: Callable[[], float] = time.monotonic
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _items: dict[str, dict[str, Any]] = field(default_factory=dict)
    _heap: list[tuple[float, int, str]] = field(default_factory=list)
    _seq: int = 0
    _failures: dict[str, int] = field(default_factory=dict)

    def add(self, obj: dict[str, Any], delay: float = 0.0) -> None:
        # managedFields is most of a record's size and nothing the handler reads: a queue
        # of thousands of records (a backlog) should not carry it.
        obj["metadata"].pop("managedFields", None)
        name = obj["metadata"]["name"]
        with self._cond:
            fresh = name not in self._items
            self._items[name] = obj
            if fresh or delay == 0.0:
                self._seq += 1
                heapq.heappush(self._heap, (self.clock() + delay, self._seq, name))
            self._cond.notify()

    def forget(self, name: str) -> None:
        with self._cond:
            self._items.pop(name, None)
            self._failures.pop(name, None)

    def get(self, timeout: float) -> dict[str, Any] | None:
        deadline = self.clock() + timeout
        with self._cond:
            while True:
                while self._heap and self._heap[0][2] not in self._items:
                    heapq.heappop(self._heap)
                now = self.clock()
                if self._heap and self._heap[0][0] <= now:
                    _, _, name = heapq.heappop(self._heap)
                    return self._items.pop(name)
                wait = deadline - now
                if self._heap:
                    wait = min(wait, self._heap[0][0] - now)
                if wait <= 0:
                    return None
                self._cond.wait(wait)

    def retry_delay(self, name: str, initial: float, cap: float) -> float:
        with self._cond:
            n = self._failures.get(name, 0) + 1
            self._failures[name] = n
        delay: float = min(cap, initial * 2.0 ** (n - 1)) * random.uniform(0.8, 1.2)
        return delay

    def done(self, name: str) -> None:
        with self._cond:
            self._failures.pop(name, None)

    def clear(self) -> None:
        with self._cond:
            self._items.clear()
            self._heap.clear()
            self._failures.clear()

    def __len__(self) -> int:
        with self._cond:
            return len(self._items)


def workload_of(pod: dict[str, Any]) -> tuple[str, str]:
    """(kind, name) of the pod's controller, without reading ReplicaSets or Jobs.

    A ReplicaSet whose pods carry `pod-template-hash` belongs to a Deployment named by
    the ReplicaSet name minus that hash; this is how Tetragon and kube-state-metrics
    users name workloads, and it needs no extra RBAC.
    """
    meta = pod.get("metadata") or {}
    owners = [o for o in meta.get("ownerReferences") or [] if o.get("controller")]
    owner = owners[0] if owners else {}
    labels = meta.get("labels") or {}
    workload = workload_from_owner(owner.get("kind"), owner.get("name"), labels)
    return (workload.kind, workload.name) if workload else ("Pod", str(meta.get("name", "")))


@dataclass
class Handler:
    """One handler replica: elector + (while leading) watcher and worker threads."""

    config: HandlerConfig
    api_client: Any
    metrics: HandlerMetrics = field(default_factory=HandlerMetrics)
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time

    def __post_init__(self) -> None:
        from kubernetes import client

        self._client = client
        self._core = client.CoreV1Api(self.api_client)
        self._custom = client.CustomObjectsApi(self.api_client)
        self.queue = WorkQueue(clock=self.clock)
        self.events = EventWriter(
            self.api_client,
            self.config.identity,
            clock=self.wall,
            timeout=self.config.request_timeout,
        )
        self.elector = LeaseElector(
            LeaseConfig(
                namespace=self.config.namespace,
                name=self.config.lease_name,
                identity=self.config.identity,
                lease_duration=self.config.lease_duration,
                renew_deadline=self.config.renew_deadline,
                retry_period=self.config.retry_period,
                request_timeout=min(self.config.request_timeout, self.config.retry_period * 2),
            ),
            self.api_client,
            on_change=self._on_leader_change,
            clock=self.clock,
        )
        self._stop = threading.Event()
        self._term: threading.Event = threading.Event()
        self._threads: list[threading.Thread] = []
        self._watch_lock = threading.Lock()
        self._watch_resp: Any = None
        self._recent: OrderedDict[str, str] = OrderedDict()  # record name -> uid, handled
        self._recent_lock = threading.Lock()
        self._busy = 0
        self.handled = 0

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        t = threading.Thread(
            target=self.elector.run, args=(self._stop,), name="execwatch-lease", daemon=True
        )
        t.start()
        self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        self._term.set()
        self._interrupt_watch()
        for t in self._threads:
            t.join(timeout=10)

    def idle(self) -> bool:
        """Nothing queued and no record being handled (tests and benchmarks wait on it)."""
        with self._recent_lock:
            busy = self._busy
        return busy == 0 and len(self.queue) == 0

    def _on_leader_change(self, leading: bool) -> None:
        self.metrics.leader.set(1 if leading else 0)
        self._threads = [t for t in self._threads if t.is_alive()]
        if leading:
            self._term = threading.Event()
            self.queue.clear()
            loops = [(self._watch_loop, "watch")]
            loops += [(self._work_loop, f"work-{i}") for i in range(self.config.workers)]
            for target, name in loops:
                t = threading.Thread(
                    target=target, args=(self._term,), name=f"execwatch-{name}", daemon=True
                )
                t.start()
                self._threads.append(t)
        else:
            self._term.set()
            self._interrupt_watch()
            self.queue.clear()

    # -- watching --------------------------------------------------------------------

    def _list(self) -> str:
        """Queue every record that exists now, in pages; return the snapshot's
        resourceVersion (the same on every page) to watch from."""
        token: str | None = None
        while True:
            result = self._custom.list_namespaced_custom_object(
                crd.GROUP,
                crd.VERSION,
                self.config.namespace,
                crd.PLURAL,
                limit=self.config.list_page,
                _continue=token,
                _request_timeout=self.config.request_timeout,
            )
            for obj in result.get("items") or []:
                self.queue.add(obj)
            meta = result.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                return str(meta["resourceVersion"])

    def _watch_loop(self, term: threading.Event) -> None:
        rv: str | None = None
        backoff = self.config.retry_initial
        last_list = 0.0
        while not term.is_set():
            try:
                if rv is None or self.clock() - last_list > self.config.resync_period:
                    rv = self._list()
                    last_list = self.clock()
                rv = self._watch_once(rv, term)
                backoff = self.config.retry_initial
            except Exception as exc:
                if term.is_set():
                    return
                err = errors.classify(exc)
                if isinstance(err, errors.ExpiredError):
                    rv = None
                self.metrics.api_errors.labels("watch", errors.code(err)).inc()
                log.warning("watch interrupted", extra={"kv": errors.as_dict(err)})
                term.wait(errors.delay(err, backoff * random.uniform(0.8, 1.2)))
                backoff = min(self.config.retry_max, backoff * 2)

    def _watch_once(self, rv: str, term: threading.Event) -> str | None:
        """One watch request from `rv`; returns where to resume (None: re-list).

        The response is kept unparsed (`_preload_content=False`) so that `stop()` and a
        lost Lease can shut its socket down and end a blocked read at once; the lines are
        split with the client's own `iter_resp_lines`."""
        from kubernetes.watch.watch import iter_resp_lines

        with errors.translate():
            resp = self._watch_request(rv)
        with self._watch_lock:
            self._watch_resp = resp
        try:
            if term.is_set():
                return rv
            for line in iter_resp_lines(resp):
                if term.is_set():
                    break
                if not line:
                    continue
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    err = errors.from_status(int(obj.get("code") or 0), str(obj.get("reason")))
                    if isinstance(err, errors.ExpiredError):
                        log.info("watch expired, re-listing")
                        return None
                    raise err
                rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                if kind in ("ADDED", "MODIFIED"):
                    self.queue.add(obj)
                elif kind == "DELETED":
                    self.queue.forget(obj["metadata"]["name"])
            return rv
        finally:
            with self._watch_lock:
                self._watch_resp = None
            resp.release_conn()

    def _watch_request(self, rv: str) -> Any:
        return self._custom.list_namespaced_custom_object(
            crd.GROUP,
            crd.VERSION,
            self.config.namespace,
            crd.PLURAL,
            watch=True,
            resource_version=rv,
            allow_watch_bookmarks=True,
            timeout_seconds=self.config.watch_timeout,
            _preload_content=False,
            _request_timeout=(self.config.request_timeout, self.config.watch_timeout + 30),
        )

    def _interrupt_watch(self) -> None:
        with self._watch_lock:
            resp = self._watch_resp
        if resp is not None:
            with contextlib.suppress(Exception):
                resp.shutdown()

    # -- working ---------------------------------------------------------------------

    def _work_loop(self, term: threading.Event) -> None:
        while not term.is_set():
            obj = self.queue.get(timeout=0.5)
            if obj is None:
                continue
            name = obj["metadata"]["name"]
            with self._recent_lock:
                self._busy += 1
            try:
                self.handle(obj)
                self.queue.done(name)
            except Retry as exc:
                if term.is_set():
                    return
                delay = self.queue.retry_delay(
                    name, self.config.retry_initial, self.config.retry_max
                )
                if exc.error is not None:
                    delay = errors.delay(exc.error, delay)
                log.info(
                    "will retry record",
                    extra={"kv": {"record": name, "why": str(exc), "delay": round(delay, 2)}},
                )
                self.queue.add(obj, delay=delay)
            except Exception:
                log.exception("unexpected error handling record", extra={"kv": {"record": name}})
                delay = self.queue.retry_delay(
                    name, self.config.retry_initial, self.config.retry_max
                )
                self.queue.add(obj, delay=delay)
            finally:
                with self._recent_lock:
                    self._busy -= 1

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
            if self._delete(name, uid):
                self.metrics.invalid.labels(bad.kind).inc()
                self.metrics.records.labels("invalid").inc()
                log.warning(
                    "invalid record deleted", extra={"kv": {"record": name, "why": str(bad)}}
                )
            return
        with self._recent_lock:
            seen_uid = self._recent.get(rec.name, rec.uid)
        if seen_uid != rec.uid:
            # An agent re-created a record we already handled (its create answer was lost).
            self._finish_duplicate(rec)
            return
        if not rec.names_pod:
            if self._delete(rec.name, rec.uid):
                self.metrics.unattributed.labels(rec.node, rec.node_arch, str(rec.reason)).inc(
                    rec.count
                )
                self._done(rec, "unattributed")
            return
        try:
            pod = self._get_pod(rec)
        except crd.InvalidRecord as bad:
            if self._delete(rec.name, rec.uid):
                self.metrics.invalid.labels(bad.kind).inc()
                self._done(rec, "invalid")
            return
        labels: dict[str, str | None] = {
            "namespace": rec.namespace,
            "workload": rec.workload or rec.pod,
            "container": rec.container,
            "node": rec.node,
            "node_arch": rec.node_arch,
            "binary_arch": rec.binary_arch,
            "reason": str(rec.reason),
            "pod": rec.pod,
        }
        if pod is None:
            # The pod is gone (or was re-created under the same name): the failure still
            # happened, so it is counted, but there is nothing to post an Event on.
            if self._delete(rec.name, rec.uid):
                self.metrics.count_failures(labels, rec.count)
                self._done(rec, "pod_missing")
            return
        if (pod.get("spec") or {}).get("nodeName") != rec.node:
            if self._delete(rec.name, rec.uid):
                self.metrics.invalid.labels("node_mismatch").inc()
                self._done(rec, "invalid")
                log.warning(
                    "record names a pod on another node",
                    extra={
                        "kv": {
                            "record": rec.name,
                            "node": rec.node,
                            "pod": f"{rec.namespace}/{rec.pod}",
                        }
                    },
                )
            return
        labels["workload"] = workload_of(pod)[1] or labels["workload"]
        self._fence()
        container_path = f"spec.containers{{{rec.container}}}" if rec.container else None
        try:
            self.events.record(rec, pod, container_path)
        except DuplicateRecord:
            self._finish_duplicate(rec)
            return
        except errors.PermanentError as err:
            # The API server (or an admission webhook) refused the Event itself: retrying
            # cannot fix it, and the failure must still be labelled and counted.
            self.metrics.api_errors.labels("event", errors.code(err)).inc()
            log.error("event refused", extra={"kv": {"record": rec.name, **errors.as_dict(err)}})
        except errors.ApiError as err:
            self.metrics.api_errors.labels("event", errors.code(err)).inc()
            raise Retry(f"event: {err}", err) from None
        if self.config.label_pods:
            self._label(rec, pod)
        if self._delete(rec.name, rec.uid):
            self.metrics.count_failures(labels, rec.count)
            self.metrics.latency.observe(max(0.0, self.wall() - rec.last_seen))
            self._done(rec, "handled")

    def _done(self, rec: crd.Record, result: str) -> None:
        self.metrics.records.labels(result).inc()
        with self._recent_lock:
            self.handled += 1
            self._recent[rec.name] = rec.uid
            while len(self._recent) > 8192:
                self._recent.popitem(last=False)
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

    def _finish_duplicate(self, rec: crd.Record) -> None:
        if self._delete(rec.name, rec.uid):
            self.metrics.records.labels("duplicate").inc()
            log.info(
                "duplicate record deleted without counting", extra={"kv": {"record": rec.name}}
            )

    def _get_pod(self, rec: crd.Record) -> dict[str, Any] | None:
        self._fence()
        try:
            with errors.translate():
                # Raw JSON, not a V1Pod: model deserialisation costs more than the request.
                resp = self._core.read_namespaced_pod(
                    rec.pod,
                    rec.namespace,
                    _request_timeout=self.config.request_timeout,
                    _preload_content=False,
                )
        except errors.NotFoundError:
            return None
        except errors.PermanentError as err:
            self.metrics.api_errors.labels("get_pod", errors.code(err)).inc()
            raise crd.InvalidRecord("pod_forbidden", f"cannot read pod: {err.status}") from None
        except errors.ApiError as err:
            self.metrics.api_errors.labels("get_pod", errors.code(err)).inc()
            raise Retry(f"get pod: {err}", err) from None
        data: dict[str, Any] = json.loads(resp.data)
        if rec.pod_uid and data["metadata"].get("uid") != rec.pod_uid:
            return None
        return data

    def _label(self, rec: crd.Record, pod: dict[str, Any]) -> None:
        value = event_reason(rec.reason)
        if (pod["metadata"].get("labels") or {}).get(LABEL) == value:
            return
        self._fence()
        body = {"metadata": {"labels": {LABEL: value}}}
        try:
            with errors.translate():
                self._core.patch_namespaced_pod(
                    rec.pod,
                    rec.namespace,
                    body,
                    _request_timeout=self.config.request_timeout,
                    _content_type="application/merge-patch+json",
                    _preload_content=False,
                )
        except errors.NotFoundError:
            return  # the pod went away between get and patch: the Event is enough
        except errors.PermanentError as err:
            # Refused (RBAC, another admission webhook): the label is skipped, the
            # failure still counted; retrying would only be refused again.
            self.metrics.api_errors.labels("label_pod", errors.code(err)).inc()
            log.warning("label refused", extra={"kv": {"record": rec.name, **errors.as_dict(err)}})
        except errors.ApiError as err:
            self.metrics.api_errors.labels("label_pod", errors.code(err)).inc()
            raise Retry(f"label pod: {err}", err) from None

    def _delete(self, name: str, uid: str) -> bool:
        """Delete the record if it is still this UID. True only for the call that did it."""
        self._fence()
        try:
            with errors.translate():
                self._custom.delete_namespaced_custom_object(
                    crd.GROUP,
                    crd.VERSION,
                    self.config.namespace,
                    crd.PLURAL,
                    name,
                    body=self._client.V1DeleteOptions(
                        preconditions=self._client.V1Preconditions(uid=uid)
                    ),
                    _request_timeout=self.config.request_timeout,
                )
            return True
        except (errors.NotFoundError, errors.ConflictError):
            return False  # already deleted (by us before a crash, or by the other replica)
        except errors.ApiError as err:
            self.metrics.api_errors.labels("delete", errors.code(err)).inc()
            raise Retry(f"delete: {err}", err) from None
