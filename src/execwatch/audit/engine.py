"""Verdicts per workload and architecture (runnable.verdict.Outcome), from one scan per
image digest and platform.

A verdict is cached on disk under the image's digest and the platform, so a re-audit only
scans images that changed; a tag that is not pinned by a running pod costs one manifest
request to learn its digest.

On nodes that emulate other architectures (`--emulates`, audit/node_emulation.py), a binary of
such an architecture runs, slowly, instead of failing: the platform's image is judged a
second time as that architecture (its loader and libraries must be there too), and a
verdict whose every failure is such a binary is EMULATED.
"""

from __future__ import annotations

import dataclasses
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
from execwatch.audit.node_emulation import Emulation
from execwatch.audit.scheduling import allowed_architectures
from execwatch.binfmt import Platform
from execwatch.record import EVERY_ARCHITECTURE_REASONS
from execwatch.runnable.limits import Limits
from execwatch.runnable.verdict import Outcome, worst
from execwatch.scan import Check, ScanOptions, scan_image
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
from execwatch.scan.vocabulary import CHECK_OF_REASON
from execwatch.text import one_line


@dataclass
class Verdict:
    status: Outcome
    platform: str
    digest: str | None = None
    findings: list[dict[str, Any]] = field(default_factory=list)
    message: str = ""
    cached: bool = False
    # EMULATED: the platform's failures that an emulator runs, each with the `arch` it runs as
    emulated: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class ContainerResult:
    container: str
    image: str
    reference: str
    init: bool
    verdict: Verdict


@dataclass
class ArchResult:
    arch: str
    containers: list[ContainerResult]

    @property
    def status(self) -> Outcome:
        """The worst of its containers' outcomes."""
        return worst(c.verdict.status for c in self.containers)


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
    emulates: dict[str, list[str]] = field(default_factory=dict)  # arch -> what its nodes emulate

    def worst(self) -> Outcome | None:
        statuses = [a.status for w in self.workloads for a in w.archs]
        return worst(statuses) if statuses else None


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

    def verdict(self, reference: str, arch: str, emulates: frozenset[str] = frozenset()) -> Verdict:
        """Never raises for one image: whatever stops its check is its UNKNOWN verdict, and
        the audit goes on with the next (an Exception, not a KeyboardInterrupt). On nodes
        that emulate `emulates`, failures that are binaries of those run, slowly."""
        platform = Platform("linux", arch)
        try:
            digest = self._digest(reference)
        except Exception as exc:
            return Verdict(Outcome.UNKNOWN, str(platform), message=_cause(exc))
        verdict = self._judged(reference, digest, platform)
        if verdict.status is Outcome.MISSING_PLATFORM:
            return self._fails_everywhere(reference, digest, verdict)
        if verdict.status is not Outcome.FAILS or not emulates:
            return verdict
        return self._emulated(reference, digest, verdict, platform, emulates)

    def _fails_everywhere(self, reference: str, digest: str, verdict: Verdict) -> Verdict:
        """An image without this platform whose entrypoint fails on every architecture (no
        `#!`, another OS's executable) would fail here as well: FAILS, with those
        findings of the platform it has. Else the MISSING_PLATFORM verdict as it is."""
        try:
            images = self._images(reference, digest)
        except Exception:  # the verdict stands: it already says what the image lacks
            return verdict
        stated = [p for p in (i.platform or i.config_platform() for i in images) if p]
        for other in stated[:1]:
            judged = self._judged(reference, digest, other)
            everywhere = [f for f in judged.findings if _every_architecture(f)]
            if everywhere:
                why = f"{verdict.message}; what it starts fails on every architecture"
                return dataclasses.replace(
                    verdict, status=Outcome.FAILS, findings=everywhere, message=why
                )
        return verdict

    def _judged(
        self, reference: str, digest: str, platform: Platform, as_arch: str = ""
    ) -> Verdict:
        """The verdict of the image for `platform`, its tree judged as `as_arch` if given."""
        key = (digest, _key(platform, as_arch))
        if key not in self.memo:
            self.memo[key] = self._load(digest, key[1]) or self._scan(
                reference, digest, platform, as_arch
            )
        return self.memo[key]

    def _emulated(
        self,
        reference: str,
        digest: str,
        verdict: Verdict,
        platform: Platform,
        emulates: frozenset[str],
    ) -> Verdict:
        """Which foreign binaries of a FAILS verdict an emulator runs: those with no
        failure when the same tree is judged as an emulated architecture."""
        foreign = {f["path"] for f in verdict.findings if f["check"] == Check.ARCH_MISMATCH}
        runs: dict[str, str] = {}
        for arch in sorted(emulates):
            left = foreign - runs.keys()
            if not left:
                break
            judged = self._judged(reference, digest, platform, arch)
            if judged.status in (Outcome.RUNS, Outcome.FAILS):
                failing = {f["path"] for f in judged.findings}
                runs.update({path: arch for path in left - failing})
        if not runs:
            return verdict

        def emulated(f: dict[str, Any]) -> bool:
            return f["check"] == Check.ARCH_MISMATCH and f["path"] in runs

        findings = [f for f in verdict.findings if not emulated(f)]
        ran = [{**f, "arch": runs[f["path"]]} for f in verdict.findings if emulated(f)]
        status = Outcome.FAILS if findings else Outcome.EMULATED
        return dataclasses.replace(verdict, status=status, findings=findings, emulated=ran)

    def _digest(self, reference: str) -> str:
        ref = Reference.parse(reference)
        if ref.digest:
            return ref.digest
        if reference not in self.resolved:
            client, top, digest = resolve(reference, self.options, self.limits)
            self.resolved[reference] = (client, top, digest)
        return self.resolved[reference][2]

    def _scan(self, reference: str, digest: str, platform: Platform, as_arch: str) -> Verdict:
        key = _key(platform, as_arch)
        try:
            image = self._select(reference, digest, platform)
            if isinstance(image, Verdict):
                return image
            if as_arch:
                image, platform = judged_as(image, as_arch), Platform("linux", as_arch)
            options = ScanOptions(limits=self.limits)
            scan_one = functools.partial(scan_image, image, options, platform)
            result = run_isolated(scan_one, self.process, f"{reference} ({key})")
        except Exception as exc:  # RecursionError, MemoryError, a bug: this image's UNKNOWN
            return Verdict(Outcome.UNKNOWN, key, digest, message=_cause(exc))
        self.scanned += 1
        failing = [f for f in result.findings if f.severity >= Severity.ERROR]
        verdict = Verdict(
            Outcome.FAILS if failing else Outcome.RUNS,
            result.platform,
            digest,
            [
                {"check": str(f.check), "path": f.path, "severity": f.severity.label,
                 "message": f.message, "entrypoint": f.entrypoint}
                for f in failing
            ],
        )  # fmt: skip
        self._store(digest, key, verdict)
        return verdict

    def _images(self, reference: str, digest: str) -> list[ImageSource]:
        if digest not in self.images:
            client, top, _ = self.resolved.get(reference) or (None, None, digest)
            if client is None or top is None:
                pinned = Reference.parse(reference)
                client, top, _ = resolve(str(pinned), self.options, self.limits)
            self.images[digest] = images_of(client, top, digest)
        return self.images[digest]

    def _select(self, reference: str, digest: str, platform: Platform) -> ImageSource | Verdict:
        images = self._images(reference, digest)
        for image in images:
            if (image.platform or image.config_platform() or platform).matches(platform):
                return image
        have = ", ".join(sorted({str(i.platform or i.config_platform()) for i in images}))
        verdict = Verdict(Outcome.MISSING_PLATFORM, str(platform), digest,
                          message=f"the image has no {platform} (it has: {have})")  # fmt: skip
        self._store(digest, str(platform), verdict)
        return verdict

    # -- the result cache --------------------------------------------------------------

    def _path(self, digest: str, key: str) -> str:
        name = hashlib.sha256(f"{__version__}\0{digest}\0{key}".encode()).hexdigest()
        return os.path.join(self.cache_dir, name + ".json")

    def _load(self, digest: str, key: str) -> Verdict | None:
        try:
            with open(self._path(digest, key), encoding="utf-8") as f:
                doc = json.load(f)
            verdict = Verdict(**{**doc, "status": Outcome(doc["status"]), "cached": True})
        except (OSError, ValueError, TypeError, KeyError):
            return None
        self.from_cache += 1
        return verdict

    def _store(self, digest: str, key: str, verdict: Verdict) -> None:
        """Best effort: a cache that cannot be written costs a re-scan next time, no more."""
        doc = {**asdict(verdict), "status": str(verdict.status)}
        del doc["cached"]
        try:
            os.makedirs(self.cache_dir, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.cache_dir, prefix=".part-")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(doc, f)
            os.replace(tmp, self._path(digest, key))
        except OSError:
            return


def _every_architecture(finding: dict[str, Any]) -> bool:
    """A finding of what the container starts that no architecture escapes."""
    checks = {str(CHECK_OF_REASON[r]) for r in EVERY_ARCHITECTURE_REASONS}
    return bool(finding["entrypoint"]) and finding["check"] in checks


def _key(platform: Platform, as_arch: str) -> str:
    """What a verdict is cached under: the platform, and the architecture it was judged as."""
    return f"{platform} as linux/{as_arch}" if as_arch else str(platform)


def judged_as(image: ImageSource, arch: str) -> ImageSource:
    """The same layers, stated as `arch`: how an emulator of `arch` sees the tree (the
    binaries of `arch` and their loaders and libraries run; the others do not)."""
    config = {k: v for k, v in image.config.items() if k not in ("architecture", "variant")}
    return dataclasses.replace(image, platform=Platform("linux", arch), config=config)


def _cause(exc: Exception) -> str:
    """The one line an UNKNOWN verdict carries: an input error's own message, else what
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
    emulation: Emulation | None = None,
) -> AuditReport:
    archs = target_architectures(inventory, planned)
    emulation = emulation or Emulation()
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
                    verdict = auditor.verdict(ref, arch, emulation.of(arch))
                    verdicts.append(ContainerResult(c.name, c.image, ref, c.init, verdict))
                    if tick is not None and (ref, arch) not in done:
                        done.add((ref, arch))
                        tick(f"{ref} {arch}")
            arch_results.append(ArchResult(arch, verdicts))
        results.append(WorkloadResult(w, arch_results, sorted(set(archs) - set(allowed))))
    emulates = {a: sorted(emulation.of(a)) for a in archs if emulation.of(a)}
    return AuditReport(archs, results, auditor.scanned, auditor.from_cache, emulates)
