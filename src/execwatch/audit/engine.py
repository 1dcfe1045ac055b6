"""Verdicts per workload and architecture, from one scan per image digest and platform.

A verdict is cached on disk under the image's digest and the platform, so a re-audit only
scans images that changed; a tag that is not pinned by a running pod costs one manifest
request to learn its digest.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from execwatch import __version__
from execwatch.audit.inventory import Inventory, Workload
from execwatch.audit.scheduling import allowed_architectures
from execwatch.binfmt import Platform
from execwatch.runnable.limits import Limits
from execwatch.scan import ScanOptions, scan_image
from execwatch.scan.errors import ScanInputError
from execwatch.scan.isolated import ProcessLimits, run_isolated
from execwatch.scan.model import Severity
from execwatch.scan.registry import (
    Reference,
    RegistryClient,
    RegistryOptions,
    default_cache_dir,
    images_of,
    resolve,
)
from execwatch.scan.sources import ImageSource
from execwatch.text import one_line


class Status(enum.IntEnum):
    """Ordered: a workload's status on an architecture is the worst of its containers'."""

    READY = 0
    MISSING_PLATFORM = 1
    WOULD_FAIL = 2
    ERROR = 3  # the image could not be checked

    @property
    def label(self) -> str:
        return self.name.lower().replace("_", "-")


@dataclass
class Verdict:
    status: Status
    platform: str
    digest: str | None = None
    findings: list[dict[str, Any]] = field(default_factory=list)
    message: str = ""
    cached: bool = False


@dataclass
class ContainerVerdict:
    container: str
    image: str
    reference: str
    init: bool
    verdict: Verdict


@dataclass
class ArchResult:
    arch: str
    containers: list[ContainerVerdict]

    @property
    def status(self) -> Status:
        return max((c.verdict.status for c in self.containers), default=Status.READY)


@dataclass
class WorkloadResult:
    workload: Workload
    archs: list[ArchResult]  # only the architectures it can be scheduled to
    unschedulable: list[str]  # target architectures its constraints exclude


@dataclass
class AuditReport:
    architectures: dict[str, str]  # arch -> "N nodes" or "planned"
    workloads: list[WorkloadResult]
    scanned: int = 0
    from_cache: int = 0

    def worst(self) -> Status | None:
        return max((a.status for w in self.workloads for a in w.archs), default=None)


Tick = Callable[[str], None]


class ImageAuditor:
    """Scans one (image, platform) at most once per run, and once per digest across runs."""

    def __init__(
        self,
        options: RegistryOptions,
        limits: Limits,
        cache_dir: str | None,
        process: ProcessLimits | None = None,
    ) -> None:
        self.options = options
        self.limits = limits
        # Each image is scanned in a child process that is killed past these (scan.isolated).
        self.process = process or ProcessLimits(wall_s=limits.max_image_seconds + 60)
        self.cache_dir = os.path.join(cache_dir or default_cache_dir(), "audit")
        self.resolved: dict[str, tuple[RegistryClient | None, dict[str, Any] | None, str]] = {}
        self.images: dict[str, list[ImageSource]] = {}
        self.memo: dict[tuple[str, str], Verdict] = {}
        self.scanned = 0
        self.from_cache = 0

    def verdict(self, reference: str, arch: str) -> Verdict:
        """Never raises for one image: whatever stops its check is its ERROR verdict, and
        the audit goes on with the next (an Exception, not a KeyboardInterrupt)."""
        platform = Platform("linux", arch)
        try:
            digest = self._digest(reference)
        except Exception as exc:
            return Verdict(Status.ERROR, str(platform), message=_cause(exc))
        key = (digest, str(platform))
        if key not in self.memo:
            self.memo[key] = self._load(digest, platform) or self._scan(reference, digest, platform)
        return self.memo[key]

    def _digest(self, reference: str) -> str:
        ref = Reference.parse(reference)
        if ref.digest:
            return ref.digest
        if reference not in self.resolved:
            client, top, digest = resolve(reference, self.options, self.limits)
            self.resolved[reference] = (client, top, digest)
        return self.resolved[reference][2]

    def _scan(self, reference: str, digest: str, platform: Platform) -> Verdict:
        try:
            image = self._select(reference, digest, platform)
            if isinstance(image, Verdict):
                return image
            options = ScanOptions(limits=self.limits)
            scan_one = functools.partial(scan_image, image, options, platform)
            result = run_isolated(scan_one, self.process, f"{reference} ({platform})")
        except Exception as exc:  # RecursionError, MemoryError, a bug: this image's ERROR
            return Verdict(Status.ERROR, str(platform), digest, message=_cause(exc))
        self.scanned += 1
        failing = [f for f in result.findings if f.severity >= Severity.ERROR]
        verdict = Verdict(
            Status.WOULD_FAIL if failing else Status.READY,
            result.platform,
            digest,
            [
                {"check": str(f.check), "path": f.path, "severity": f.severity.label,
                 "message": f.message, "entrypoint": f.entrypoint}
                for f in failing
            ],
        )  # fmt: skip
        self._store(digest, platform, verdict)
        return verdict

    def _select(self, reference: str, digest: str, platform: Platform) -> ImageSource | Verdict:
        if digest not in self.images:
            client, top, _ = self.resolved.get(reference) or (None, None, digest)
            if client is None or top is None:
                pinned = Reference.parse(reference)
                client, top, _ = resolve(str(pinned), self.options, self.limits)
            self.images[digest] = images_of(client, top, digest)
        images = self.images[digest]
        for image in images:
            if (image.platform or image.config_platform() or platform).matches(platform):
                return image
        have = ", ".join(sorted({str(i.platform or i.config_platform()) for i in images}))
        verdict = Verdict(Status.MISSING_PLATFORM, str(platform), digest,
                          message=f"the image has no {platform} (it has: {have})")  # fmt: skip
        self._store(digest, platform, verdict)
        return verdict

    # -- the result cache --------------------------------------------------------------

    def _path(self, digest: str, platform: Platform) -> str:
        name = hashlib.sha256(f"{__version__}\0{digest}\0{platform}".encode()).hexdigest()
        return os.path.join(self.cache_dir, name + ".json")

    def _load(self, digest: str, platform: Platform) -> Verdict | None:
        try:
            with open(self._path(digest, platform), encoding="utf-8") as f:
                doc = json.load(f)
            verdict = Verdict(**{**doc, "status": Status[doc["status"]], "cached": True})
        except (OSError, ValueError, TypeError, KeyError):
            return None
        self.from_cache += 1
        return verdict

    def _store(self, digest: str, platform: Platform, verdict: Verdict) -> None:
        """Best effort: a cache that cannot be written costs a re-scan next time, no more."""
        doc = {**asdict(verdict), "status": verdict.status.name}
        del doc["cached"]
        try:
            os.makedirs(self.cache_dir, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.cache_dir, prefix=".part-")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(doc, f)
            os.replace(tmp, self._path(digest, platform))
        except OSError:
            return


def _cause(exc: Exception) -> str:
    """The one line an ERROR verdict carries: an input error's own message, else what
    kind of failure stopped the scan."""
    if isinstance(exc, ScanInputError):
        return one_line(str(exc))
    detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return one_line(f"the scan could not finish: {detail}")


def target_architectures(inventory: Inventory, planned: list[str]) -> dict[str, str]:
    """The architectures of the Linux nodes (with their count), then the planned ones."""
    out: dict[str, str] = {}
    for node in inventory.nodes:
        if node.os == "linux":
            count = int(out.get(node.arch, "0 nodes").split()[0]) + 1
            out[node.arch] = f"{count} node{'s' if count > 1 else ''}"
    for arch in planned:
        out.setdefault(arch, "planned")
    return out


def audit(
    inventory: Inventory,
    planned: list[str],
    auditor: ImageAuditor,
    progress: Callable[[int], Tick] | None = None,
) -> AuditReport:
    archs = target_architectures(inventory, planned)
    plan: list[tuple[Workload, list[str]]] = []
    for w in inventory.workloads:
        plan.append((w, sorted(allowed_architectures(w.pod_spec, set(archs)))))
    pairs = {(ref, a) for w, allowed in plan for c in w.containers for ref in c.references
             for a in allowed}  # fmt: skip
    tick = progress(len(pairs)) if progress is not None else None
    done: set[tuple[str, str]] = set()
    results = []
    for w, allowed in plan:
        arch_results = []
        for arch in allowed:
            verdicts = []
            for c in w.containers:
                for ref in c.references:
                    verdicts.append(ContainerVerdict(c.name, c.image, ref, c.init,
                                                     auditor.verdict(ref, arch)))  # fmt: skip
                    if tick is not None and (ref, arch) not in done:
                        done.add((ref, arch))
                        tick(f"{ref} {arch}")
            arch_results.append(ArchResult(arch, verdicts))
        results.append(WorkloadResult(w, arch_results, sorted(set(archs) - set(allowed))))
    return AuditReport(archs, results, auditor.scanned, auditor.from_cache)
