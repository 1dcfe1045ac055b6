"""Verdicts for placement from the scan engine: what a container starts, per node
architecture.

The image is resolved with the pod's own pull secrets (pullsecrets.py) on every pod, so a
pod that could not pull the image learns nothing from a verdict another pod earned. Each
program the container starts (started.py) is the Entrypoint of one scan of that
platform's image, in a process of its own; its findings decide, other binaries' findings
are reported and decide only with `strict`. Verdicts are memoised per image digest,
platform and programs.

With a `VerdictWriter`, the ImageVerdict of the resolved digest is read first. A sighting
(a failure the handler saw, younger than `observed_for`) decides its platform for the
pods of its own namespace and owner; for any other pod only when the scan of the image's
own file at the sighting's path fails on that platform too, so a file a tenant wrote or
mounted never decides for another. A scan verdict younger than `fresh_for` saves the
scan of a container that starts what the image starts by default (no `command`, `args`,
`env` nor `workingDir`), the only start a verdict per digest describes. Such scans are
written back, off the placement path.

Registry requests go through the process's `RegistryReuse`: a warm pod costs one HEAD of
each image's reference with the pod's credentials, over a kept connection, with the token
its credential obtained before; the manifests of a digest seen before come from memory.
"""

from __future__ import annotations

import dataclasses
import functools
import posixpath
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cachetools import FIFOCache, LRUCache

from execwatch.binfmt import Platform
from execwatch.crd import parse_time
from execwatch.kube import errors
from execwatch.placement.controller import VerdictUnavailable
from execwatch.placement.decision import ContainerVerdict
from execwatch.placement.pullsecrets import PullSecrets
from execwatch.placement.started import Started, Unresolved, started
from execwatch.placement.verdicts import (
    DIGEST,
    SIGHTING_TTL,
    ImageVerdict,
    PlatformVerdict,
    Sighting,
    VerdictWriter,
    Write,
    now_rfc3339,
    owner_of,
)
from execwatch.placement.verdicts import MAX_WHY as STORED_WHY
from execwatch.record import EVERY_ARCHITECTURE_REASONS
from execwatch.runnable.limits import Limits
from execwatch.runnable.verdict import Outcome
from execwatch.scan import Check, ScanOptions, Severity, scan_image
from execwatch.scan.egress import Egress
from execwatch.scan.errors import ScanInputError
from execwatch.scan.isolated import ProcessLimits, run_isolated
from execwatch.scan.registry import RegistryOptions, resolve_images
from execwatch.scan.reuse import RegistryReuse
from execwatch.scan.sources import ImageSource
from execwatch.scan.vocabulary import REASON_OF_CHECK
from execwatch.text import one_line

MAX_WHY = 3
MAX_CONFIRM = 3  # sightings of other workloads checked against the image, per platform
MEMO_SIZE = 1024
READ_TIMEOUT = 2.0  # seconds for the ImageVerdict read; past it the pod is scanned
TOUCH_EVERY = 3600.0  # seconds: lastUsed of a verdict that decides is renewed this often

# (path, message, whether the pod starts it, whether it fails on every architecture): one
# failing binary on one platform
Seen = tuple[str, str, bool, bool]


@dataclass(frozen=True)
class ResolvedImage:
    """One container's image as resolved for its pod, and the digest's stored verdict."""

    image: str
    digest: str  # sha256 of what the reference resolved to, '' when it is not one
    images: list[ImageSource]
    book: ImageVerdict | None
    workload: tuple[str, str]  # the pod's namespace and owner (owner_of)


@dataclass
class _Verdict:
    """A ContainerVerdict being filled in, one architecture at a time."""

    container: str
    image: str
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    why: dict[str, str] = field(default_factory=dict)
    reported: dict[str, str] = field(default_factory=dict)
    everywhere: str = ""

    def set(self, arch: str, outcome: Outcome, why: str) -> None:
        self.outcomes[arch] = outcome
        if why:
            self.why[arch] = why

    def done(self) -> ContainerVerdict:
        return ContainerVerdict(
            self.container, self.image, self.outcomes, self.why, self.reported, self.everywhere
        )


@dataclass
class ScannedVerdicts:
    secrets: PullSecrets
    registry: RegistryOptions  # CA, plain-HTTP hosts, blob cache, timeout: never credentials
    limits: Limits
    arches: Callable[[], Iterable[str]]
    strict: bool = False
    writer: VerdictWriter | None = None  # the ImageVerdict store: read first, scans written
    fresh_for: float = 86400.0  # seconds a stored scan verdict saves a scan
    observed_for: float = SIGHTING_TTL  # seconds a sighting decides from when it was written
    memo: LRUCache[tuple[str, str, Started], list[Seen]] = field(
        default_factory=lambda: LRUCache(MEMO_SIZE)
    )
    _touched: FIFOCache[str, float] = field(default_factory=lambda: FIFOCache(MEMO_SIZE))
    _lock: threading.Lock = field(default_factory=threading.Lock)  # the controller's workers

    def __post_init__(self) -> None:
        if self.registry.reuse is None:  # one memo, auth cache and session pool per process
            self.registry = dataclasses.replace(self.registry, reuse=RegistryReuse())
        if self.registry.egress is None:  # placement never reaches a private address unasked
            self.registry = dataclasses.replace(self.registry, egress=Egress())

    def judge(
        self, pod: Mapping[str, Any], container: Mapping[str, Any], deadline: float
    ) -> ContainerVerdict:
        image = str(container.get("image") or "")
        arches = list(self.arches())
        with self.secrets.files(pod) as files:
            left = max(1.0, deadline - time.time())
            options = dataclasses.replace(
                self.registry,
                config_files=files,
                timeout=min(self.registry.timeout, left),
                deadline=left,  # the resolution's, whatever the registry does
            )
            images, digest = self._images(image, options, arches)
        verdict = _Verdict(str(container.get("name") or ""), image)
        book = self._book(digest, deadline)
        workload = (str((pod.get("metadata") or {}).get("namespace") or ""), owner_of(pod))
        target = ResolvedImage(image, digest, images, book, workload)
        for arch in arches:
            self._judge_arch(verdict, target, container, arch, deadline)
        return verdict.done()

    def _judge_arch(
        self,
        verdict: _Verdict,
        target: ResolvedImage,
        container: Mapping[str, Any],
        arch: str,
        deadline: float,
    ) -> None:
        platform = Platform("linux", arch)
        sightings = self._sightings(target.book, str(platform))
        own = [s for s in sightings if (s.namespace, s.owner) == target.workload]
        if own:
            self._used(target, "observed")
            verdict.set(arch, Outcome.FAILS, "observed failing in this workload: " + _seen(own))
            return
        chosen = _select(target.images, platform)
        if chosen is None:
            verdict.set(arch, Outcome.FAILS, f"the image has no {platform}")
            return
        confirmed = self._confirmed(target, chosen, platform, sightings, deadline)
        if confirmed:
            self._used(target, "observed")
            verdict.set(arch, Outcome.FAILS, confirmed)
            return
        try:
            programs = started(container, chosen.config)
        except Unresolved as exc:
            verdict.set(arch, Outcome.UNKNOWN, str(exc))
            return
        default = not self.strict and _is_default(programs, chosen.config)
        stored = self._fresh(target.book, str(platform)) if default else None
        if stored is not None:
            self._used(target, "fresh")
            verdict.set(arch, stored.outcome, _stored_lines(stored))
            return
        seen, scanned = self._scan(target.image, chosen, platform, programs, deadline)
        everywhere = [s for s in seen if s[3]]
        if everywhere:  # no architecture runs it: nothing to place by, nothing to store
            verdict.everywhere = _lines(everywhere)
            verdict.set(arch, Outcome.UNKNOWN, verdict.everywhere)
            return
        deciding = [s for s in seen if s[2] or self.strict]
        others = [s for s in seen if not (s[2] or self.strict)]
        verdict.set(arch, Outcome.FAILS if deciding else Outcome.RUNS, _lines(deciding))
        if others:
            verdict.reported[arch] = _lines(others)
        if default and scanned:
            self._write_scan(target, str(platform), deciding)

    def _book(self, digest: str, deadline: float) -> ImageVerdict | None:
        """The digest's ImageVerdict, or None: none, no store, or unreadable in time."""
        if self.writer is None or not digest:
            return None
        try:
            timeout = min(READ_TIMEOUT, max(0.1, deadline - time.time()))
            return self.writer.store.get(digest, timeout=timeout)
        except (errors.ApiError, ValueError):
            self.writer.metrics.reads.labels("failed").inc()
            return None

    def _sightings(self, book: ImageVerdict | None, platform: str) -> list[Sighting]:
        """The digest's sightings on `platform` younger than `observed_for`."""
        now = time.time()
        found = book.observed if book is not None else ()
        return [s for s in found if s.platform == platform and s.fresh(now, self.observed_for)]

    def _confirmed(
        self,
        target: ResolvedImage,
        image: ImageSource,
        platform: Platform,
        sightings: list[Sighting],
        deadline: float,
    ) -> str:
        """Why the image fails on `platform` by its own files, when another workload's
        sighting names a file that the scan of this image finds failing there too ('' when
        none does: a file written at run time or on a volume is not the image's)."""
        for file in _most_seen(sightings)[:MAX_CONFIRM]:
            program = Started(((file,),), (), None)
            seen, _ = self._scan(target.image, image, platform, program, deadline)
            failing = [s for s in seen if s[2]]
            if failing:
                why = _lines(failing)
                return f"observed failing on a node, and the image's own {file} fails there: {why}"
        return ""

    def _fresh(self, book: ImageVerdict | None, platform: str) -> PlatformVerdict | None:
        found = book.platforms.get(platform) if book is not None else None
        if found is None or found.source != "scan" or found.outcome is Outcome.UNKNOWN:
            return None
        written = parse_time(found.time)
        return found if written is not None and time.time() - written < self.fresh_for else None

    def _used(self, target: ResolvedImage, how: str) -> None:
        """Count the read that decided, and renew the verdict's lastUsed now and then."""
        assert self.writer is not None and target.book is not None
        self.writer.metrics.reads.labels(how).inc()
        now = time.time()
        with self._lock:
            last = max(target.book.last_used or 0.0, self._touched.get(target.digest, 0.0))
            if now - last < TOUCH_EVERY:
                return
            self._touched[target.digest] = now
        self.writer.offer(Write(target.digest, target.image, (), "touch"))

    def _write_scan(self, target: ResolvedImage, platform: str, deciding: list[Seen]) -> None:
        if self.writer is None or not target.digest:
            return
        outcome = Outcome.FAILS if deciding else Outcome.RUNS
        why = tuple(f"{path}: {message}" for path, message, _, _ in deciding[:STORED_WHY])
        now = now_rfc3339(time.time)
        news = (PlatformVerdict(platform, outcome, "scan", now, why, len(deciding)),)
        self.writer.offer(Write(target.digest, target.image, news, "scan"))

    def _images(
        self, image: str, options: RegistryOptions, arches: list[str]
    ) -> tuple[list[ImageSource], str]:
        """The platform images of the nodes' architectures, and the digest the image
        resolved to ('' if not sha256)."""
        platforms = [Platform("linux", arch) for arch in arches]
        try:
            _, images, digest = resolve_images(image, options, self.limits, platforms)
            return images, _sha256(digest)
        except ScanInputError as exc:
            raise VerdictUnavailable(one_line(str(exc))) from None
        except Exception as exc:  # a bug or a hostile answer: fail open, never stuck
            # its class only: an exception's text may quote what a registry answered
            raise VerdictUnavailable(f"{image[:200]}: {type(exc).__name__}") from None

    def _scan(
        self, label: str, image: ImageSource, platform: Platform, programs: Started, deadline: float
    ) -> tuple[list[Seen], bool]:
        """What fails among what `programs` start, and whether it was scanned now."""
        key = (str(image.digest or label), str(platform), programs)
        with self._lock:
            if key in self.memo:
                return self.memo[key], False  # an LRU hit: now the newest
        left = deadline - time.time()
        if left <= 0:
            raise VerdictUnavailable("no verdict before the pod's deadline")
        work = functools.partial(_scan_programs, image, programs, platform, self.limits)
        try:
            seen = run_isolated(work, ProcessLimits(wall_s=left), f"{label} ({platform})")
        except Exception as exc:
            raise VerdictUnavailable(one_line(str(exc) or type(exc).__name__)) from None
        with self._lock:
            self.memo[key] = seen
        return seen, True


def _scan_programs(
    image: ImageSource, programs: Started, platform: Platform, limits: Limits
) -> list[Seen]:
    """Each program as the image's Entrypoint: the binaries it starts, then the others.
    A program absent from the image is reported, never decisive: a volume may hold it. The
    first word of `sh -c` without `#!` is no failure: the shell retries it with /bin/sh."""
    options = ScanOptions(limits=limits)
    seen: dict[str, Seen] = {}
    for i, config in enumerate(programs.configs(image.config)):
        result = scan_image(dataclasses.replace(image, config=config), options, platform)
        for f in result.findings:
            if f.severity < Severity.ERROR or (i > 0 and not f.entrypoint):
                continue
            if i > 0 and f.check is Check.MISSING_SHEBANG:
                continue
            # A program absent from the image may come from a volume, on every architecture.
            starts = f.entrypoint and f.check is not Check.MISSING_ENTRYPOINT
            key = f"{f.path}\0{f.message}"
            everywhere = starts and REASON_OF_CHECK.get(f.check) in EVERY_ARCHITECTURE_REASONS
            if starts or key not in seen:
                seen[key] = (f.path, f.message, starts, everywhere)
    return sorted(seen.values(), key=lambda s: (not s[2], s[0]))


def _select(images: list[ImageSource], platform: Platform) -> ImageSource | None:
    for image in images:
        if (image.platform or image.config_platform() or platform).matches(platform):
            return image
    return None


def _lines(seen: list[Seen]) -> str:
    text = "; ".join(f"{path}: {message}" for path, message, _, _ in seen[:MAX_WHY])
    more = f" (and {len(seen) - MAX_WHY} more)" if len(seen) > MAX_WHY else ""
    return text + more


def _sha256(digest: object) -> str:
    text = str(digest or "")
    return text if DIGEST.fullmatch(text) else ""


def _is_default(programs: Started, image_config: Mapping[str, Any]) -> bool:
    """Whether the container starts exactly what the image starts by itself."""
    try:
        return programs == started({}, image_config)
    except Unresolved:
        return False


def _most_seen(sightings: list[Sighting]) -> list[str]:
    """The absolute paths sighted, those most workloads saw fail first."""
    workloads: dict[str, set[tuple[str, str]]] = {}
    for s in sightings:
        if s.path.startswith("/"):
            workloads.setdefault(posixpath.normpath(s.path), set()).add((s.namespace, s.owner))
    return sorted(workloads, key=lambda path: (-len(workloads[path]), path))


def _seen(sightings: list[Sighting]) -> str:
    """What the workload's own sightings say, newest first."""
    newest = sorted(sightings, key=lambda s: s.time, reverse=True)
    text = "; ".join(s.why or s.path for s in newest[:MAX_WHY])
    more = len(newest) - MAX_WHY
    return text + (f" (and {more} more)" if more > 0 else "")


def _stored_lines(verdict: PlatformVerdict) -> str:
    text = "; ".join(verdict.why[:MAX_WHY])
    more = verdict.count - min(len(verdict.why), MAX_WHY)
    return text + (f" (and {more} more)" if more > 0 and text else "")
