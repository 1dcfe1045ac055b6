"""ImageVerdict objects: the one cache of what each image digest runs on, per platform.

The placement controller writes what its scans found (`platforms`), the handler writes
what it saw fail on a node (`observed`: sightings, each scoped to the namespace and owner
of the pod that failed), and both read. A sighting is a tenant's word, not the image's:
the controller lets it decide for the pods of its own namespace and owner only, or for
others once its own scan of the image's file at that path confirms it (scanned.py), and
for `SIGHTING_TTL` seconds from when it was written, which no read renews. Writes are
read-modify-write under the object's resourceVersion, so concurrent writers merge
instead of overwriting each other.

Nothing that places or handles waits on these writes: they go through a `Lane`, a bounded
queue with one writer thread, paced, whose drops and failures are counted
(`VerdictMetrics`) and never raised to the caller.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import queue
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar

from prometheus_client import CollectorRegistry, Counter

from execwatch.crd import parse_time
from execwatch.kube import backoff, errors
from execwatch.kube.client import Rest, path
from execwatch.runnable.verdict import Outcome

GROUP, VERSION, PLURAL = "execwatch.io", "v1alpha1", "imageverdicts"
DIGEST = re.compile(r"sha256:[a-f0-9]{64}")
MAX_WHY = 8
MAX_WHY_TEXT = 1024  # characters of each `why` line (the schema's maxLength)
MAX_SIGHTINGS = 32  # per digest; past it the oldest go first
MAX_SIGHTING_TEXT = 512  # characters of a sighting's namespace, owner, path and why
SIGHTING_TTL = 86400.0  # seconds a sighting counts from when it was written
WRITE_ATTEMPTS = 16

log = logging.getLogger(__name__)
T = TypeVar("T")


def object_name(digest: str) -> str:
    if not DIGEST.fullmatch(digest):
        raise ValueError(f"not a sha256 digest: {digest[:80]!r}")
    return digest.replace(":", "-")


@dataclass(frozen=True)
class PlatformVerdict:
    platform: str  # OCI platform, os/arch[/variant]
    outcome: Outcome
    source: str  # "scan" or "observed"
    time: str  # RFC 3339
    why: tuple[str, ...] = ()
    count: int = 0

    @property
    def arch(self) -> str:
        """The node label value `kubernetes.io/arch` this platform runs on."""
        return self.platform.split("/")[1]

    def to_api(self) -> dict[str, Any]:
        return {
            "platform": self.platform,
            "outcome": str(self.outcome),
            "source": self.source,
            "time": self.time,
            "why": [w[:MAX_WHY_TEXT] for w in self.why[:MAX_WHY]],
            "count": self.count,
        }

    @classmethod
    def from_api(cls, obj: Mapping[str, Any]) -> PlatformVerdict:
        return cls(
            str(obj["platform"]),
            Outcome(obj["outcome"]),
            str(obj["source"]),
            str(obj["time"]),
            tuple(str(w) for w in obj.get("why") or ()),
            int(obj.get("count") or 0),
        )


@dataclass(frozen=True)
class Sighting:
    """A platform-class failure the handler saw in a pod of an opted-in namespace: the
    tenant's word about its own workload, whatever file it ran."""

    platform: str  # linux/<the node's architecture>
    namespace: str
    owner: str  # the pod's controller as Kind/name, else Pod/<name> (owner_of)
    path: str  # the file that failed, as the agent recorded the exec
    time: str  # RFC 3339: when it was last written; a read never renews it
    why: str = ""
    count: int = 0

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.platform, self.namespace, self.owner, self.path)

    def fresh(self, now: float, ttl: float) -> bool:
        written = parse_time(self.time)
        return written is not None and now - written < ttl

    def to_api(self) -> dict[str, Any]:
        cut = MAX_SIGHTING_TEXT
        return {
            "platform": self.platform,
            "namespace": self.namespace[:cut],
            "owner": self.owner[:cut],
            "path": self.path[:cut],
            "time": self.time,
            "why": self.why[:cut],
            "count": self.count,
        }

    @classmethod
    def from_api(cls, obj: Mapping[str, Any]) -> Sighting:
        return cls(
            str(obj["platform"]),
            str(obj["namespace"]),
            str(obj["owner"]),
            str(obj["path"]),
            str(obj["time"]),
            str(obj.get("why") or ""),
            int(obj.get("count") or 0),
        )


def owner_of(pod: Mapping[str, Any]) -> str:
    """Whose workload a pod is: its controller as Kind/name, else the bare pod's name."""
    meta = pod.get("metadata") or {}
    for ref in meta.get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller"):
            return f"{ref.get('kind') or ''}/{ref.get('name') or ''}"
    return f"Pod/{meta.get('name') or ''}"


@dataclass(frozen=True)
class ImageVerdict:
    digest: str
    image: str
    platforms: Mapping[str, PlatformVerdict] = field(default_factory=dict)
    last_used: float | None = None  # seconds since the epoch, None when never written
    observed: tuple[Sighting, ...] = ()

    def merged(
        self, news: Iterable[PlatformVerdict], sightings: Iterable[Sighting] = ()
    ) -> ImageVerdict:
        """The scans' verdicts per platform replaced by `news`; `sightings` replacing those
        of the same platform, namespace, owner and path, the newest MAX_SIGHTINGS kept."""
        out = dict(self.platforms)
        for new in news:
            out[new.platform] = new
        seen = {s.key: s for s in self.observed}
        for sighting in sightings:
            seen[sighting.key] = sighting
        newest = sorted(seen.values(), key=lambda s: s.time, reverse=True)[:MAX_SIGHTINGS]
        return replace(self, platforms=out, observed=tuple(newest))

    def status(self, last_used: str) -> dict[str, Any]:
        def which(outcome: Outcome) -> str:
            return ",".join(sorted(p for p, v in self.platforms.items() if v.outcome is outcome))

        return {
            "runs": which(Outcome.RUNS),
            "emulated": which(Outcome.EMULATED),
            "fails": which(Outcome.FAILS),
            "lastUsed": last_used,
            "platforms": [self.platforms[p].to_api() for p in sorted(self.platforms)],
            "observed": [s.to_api() for s in self.observed],
        }


def now_rfc3339(clock: Callable[[], float]) -> str:
    return dt.datetime.fromtimestamp(clock(), dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class VerdictStore:
    rest: Rest
    clock: Callable[[], float]

    def _path(self, name: str | None = None) -> str:
        return path("apis", GROUP, VERSION, PLURAL, *((name,) if name else ()))

    def get(self, digest: str, timeout: float | None = None) -> ImageVerdict | None:
        obj = self._read(object_name(digest), timeout)
        return None if obj is None else _parse(obj)

    def record(
        self,
        digest: str,
        image: str,
        news: Iterable[PlatformVerdict],
        sightings: Iterable[Sighting] = (),
    ) -> ImageVerdict:
        """Merge `news` and `sightings` into the digest's verdict and write it; returns
        what was written."""
        name, news, sightings = object_name(digest), list(news), list(sightings)
        for attempt in range(WRITE_ATTEMPTS):
            obj = self._read(name)
            base = ImageVerdict(digest, image) if obj is None else _parse(obj)
            verdict = base.merged(news, sightings)
            body: dict[str, Any] = {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "ImageVerdict",
                "metadata": {"name": name},
                "spec": {"digest": digest, "image": image[:512]},
                "status": verdict.status(now_rfc3339(self.clock)),
            }
            try:
                if obj is None:
                    self.rest.call("POST", self._path(), body=body)
                else:
                    body["metadata"]["resourceVersion"] = obj["metadata"]["resourceVersion"]
                    self.rest.call("PUT", self._path(name), body=body)
                return verdict
            except errors.ConflictError:  # another writer came first: merge into theirs
                time.sleep(backoff.delay(attempt + 1, 0.01, 0.2, backoff.Jitter.FULL))
        raise errors.RetryableError(409, "Conflict", f"{name}: {WRITE_ATTEMPTS} writers raced")

    def _read(self, name: str, timeout: float | None = None) -> dict[str, Any] | None:
        try:
            return self.rest.call("GET", self._path(name), timeout=timeout)
        except errors.NotFoundError:
            return None


def _parse(obj: Mapping[str, Any]) -> ImageVerdict:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    platforms = [PlatformVerdict.from_api(p) for p in status.get("platforms") or []]
    return ImageVerdict(
        str(spec["digest"]),
        str(spec.get("image") or ""),
        {p.platform: p for p in platforms},
        parse_time(status.get("lastUsed")),
        tuple(Sighting.from_api(s) for s in status.get("observed") or []),
    )


@dataclass
class VerdictMetrics:
    """Counts of the verdict store's reads and of the writes no caller waits for."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        self.writes = Counter(
            "execwatch_verdict_writes",
            "ImageVerdict writes, by source (scan, observed, touch: lastUsed only) and result "
            "(written; failed: the API refused or did not answer, counted once per write; "
            "dropped: the writer's queue was full; ignored: observed in a namespace that "
            "did not opt in to placement).",
            ["source", "result"],
            registry=self.registry,
        )
        self.reads = Counter(
            "execwatch_verdict_reads",
            "ImageVerdict reads by the placement controller that decided or failed, by "
            "result (observed: an observed failure decided a platform; fresh: a stored scan "
            "verdict saved a scan; failed: unreadable in time, the pod is scanned).",
            ["result"],
            registry=self.registry,
        )


@dataclass
class Lane(Generic[T]):
    """A bounded queue and one thread that hands each item to `work`, at most `rate` items
    a second. Whoever offers never waits: what does not fit is dropped (`dropped` is
    called). `tick`, when given, runs at least once a second on that thread."""

    work: Callable[[T], None]
    name: str
    dropped: Callable[[T], None]
    size: int = 256
    rate: float = 0.0  # items per second; 0: as fast as they come
    tick: Callable[[], None] | None = None
    _queue: queue.Queue[T] = field(init=False)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __post_init__(self) -> None:
        self._queue = queue.Queue(self.size)

    def offer(self, item: T) -> bool:
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self.dropped(item)
            return False
        return True

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, name=f"execwatch-{self.name}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def idle(self) -> bool:
        """Nothing queued nor being worked on (tests wait on it)."""
        return self._queue.unfinished_tasks == 0

    def _run(self) -> None:
        gap = 1.0 / self.rate if self.rate > 0 else 0.0
        while not self._stop.is_set():
            try:
                item = self._queue.get(timeout=1.0)
            except queue.Empty:
                self._safely(self.tick)
                continue
            started = time.monotonic()
            try:
                self._safely(functools.partial(self.work, item))
                self._safely(self.tick)
            finally:
                self._queue.task_done()
            self._stop.wait(max(0.0, gap - (time.monotonic() - started)))

    def _safely(self, step: Callable[[], None] | None) -> None:
        if step is None:
            return
        try:
            step()
        except Exception:  # a bug must not end the lane: the next item still goes
            log.exception("verdict lane step failed", extra={"kv": {"lane": self.name}})


@dataclass(frozen=True)
class Write:
    """One merge into a digest's verdict; `source` names it in the metric."""

    digest: str
    image: str
    news: tuple[PlatformVerdict, ...]
    source: str  # scan, observed or touch (no news: lastUsed only)


@dataclass
class VerdictWriter:
    """The verdict store behind one paced writer thread: `offer` never waits."""

    store: VerdictStore
    metrics: VerdictMetrics
    size: int = 256
    rate: float = 10.0  # writes per second

    def __post_init__(self) -> None:
        self.lane: Lane[Write] = Lane(
            self._write, "verdict-writer", self._dropped, self.size, self.rate
        )

    def offer(self, write: Write) -> bool:
        object_name(write.digest)  # a caller's bug, not the API's: raise here, not later
        return self.lane.offer(write)

    def start(self) -> None:
        self.lane.start()

    def stop(self) -> None:
        self.lane.stop()

    def _write(self, write: Write) -> None:
        try:
            self.store.record(write.digest, write.image, write.news)
        except errors.ApiError as err:
            self.metrics.writes.labels(write.source, "failed").inc()
            log.warning(
                "verdict not written", extra={"kv": {"digest": write.digest, **errors.as_dict(err)}}
            )
            return
        self.metrics.writes.labels(write.source, "written").inc()

    def _dropped(self, write: Write) -> None:
        self.metrics.writes.labels(write.source, "dropped").inc()
