"""Verdicts for placement from the scan engine: what a container starts, per node
architecture.

The image is resolved with the pod's own pull secrets (pullsecrets.py) on every pod, so a
pod that could not pull the image learns nothing from a verdict another pod earned. Each
program the container starts (started.py) is the Entrypoint of one scan of that
platform's image, in a process of its own; its findings decide, other binaries' findings
are reported and decide only with `strict`. Verdicts are memoised per image digest,
platform and programs.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from execwatch.binfmt import Platform
from execwatch.placement.controller import VerdictUnavailable
from execwatch.placement.decision import ContainerVerdict, Outcome
from execwatch.placement.pullsecrets import PullSecrets
from execwatch.placement.started import Started, Unresolved, started
from execwatch.runnable.limits import Limits
from execwatch.scan import Check, ScanOptions, Severity, scan_image
from execwatch.scan.errors import ScanInputError
from execwatch.scan.isolated import ProcessLimits, run_isolated
from execwatch.scan.registry import RegistryOptions, images_of, resolve
from execwatch.scan.sources import ImageSource
from execwatch.text import one_line

MAX_WHY = 3
MEMO_SIZE = 1024

# (path, message, whether the pod starts it): one failing binary on one platform
Seen = tuple[str, str, bool]


@dataclass
class ScannedVerdicts:
    secrets: PullSecrets
    registry: RegistryOptions  # CA, plain-HTTP hosts, blob cache, timeout: never credentials
    limits: Limits
    arches: Callable[[], Iterable[str]]
    strict: bool = False
    memo: OrderedDict[tuple[str, str, Started], list[Seen]] = field(default_factory=OrderedDict)
    _lock: threading.Lock = field(default_factory=threading.Lock)  # the controller's workers

    def judge(
        self, pod: Mapping[str, Any], container: Mapping[str, Any], deadline: float
    ) -> ContainerVerdict:
        image = str(container.get("image") or "")
        name = str(container.get("name") or "")
        with self.secrets.files(pod) as files:
            timeout = min(self.registry.timeout, max(1.0, deadline - time.time()))
            options = dataclasses.replace(self.registry, config_files=files, timeout=timeout)
            images = self._images(image, options)
        outcomes: dict[str, Outcome] = {}
        why: dict[str, str] = {}
        reported: dict[str, str] = {}
        for arch in self.arches():
            platform = Platform("linux", arch)
            chosen = _select(images, platform)
            if chosen is None:
                outcomes[arch], why[arch] = Outcome.FAILS, f"the image has no {platform}"
                continue
            try:
                programs = started(container, chosen.config)
            except Unresolved as exc:
                outcomes[arch], why[arch] = Outcome.UNKNOWN, str(exc)
                continue
            seen = self._scan(image, chosen, platform, programs, deadline)
            deciding = [s for s in seen if s[2] or self.strict]
            others = [s for s in seen if not (s[2] or self.strict)]
            outcomes[arch] = Outcome.FAILS if deciding else Outcome.RUNS
            if deciding:
                why[arch] = _lines(deciding)
            if others:
                reported[arch] = _lines(others)
        return ContainerVerdict(name, image, outcomes, why, reported)

    def _images(self, image: str, options: RegistryOptions) -> list[ImageSource]:
        try:
            client, top, digest = resolve(image, options, self.limits)
            return images_of(client, top, digest)
        except ScanInputError as exc:
            raise VerdictUnavailable(one_line(str(exc))) from None
        except Exception as exc:  # a bug or a hostile answer: fail open, never stuck
            raise VerdictUnavailable(one_line(f"{image}: {type(exc).__name__}: {exc}")) from None

    def _scan(
        self, label: str, image: ImageSource, platform: Platform, programs: Started, deadline: float
    ) -> list[Seen]:
        key = (str(image.digest or label), str(platform), programs)
        with self._lock:
            if key in self.memo:
                self.memo.move_to_end(key)
                return self.memo[key]
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
            while len(self.memo) > MEMO_SIZE:
                self.memo.popitem(last=False)
        return seen


def _scan_programs(
    image: ImageSource, programs: Started, platform: Platform, limits: Limits
) -> list[Seen]:
    """Each program as the image's Entrypoint: the binaries it starts, then the others.
    A program absent from the image is reported, never decisive: a volume may hold it."""
    options = ScanOptions(limits=limits)
    seen: dict[str, Seen] = {}
    for i, config in enumerate(programs.configs(image.config)):
        result = scan_image(dataclasses.replace(image, config=config), options, platform)
        for f in result.findings:
            if f.severity < Severity.ERROR or (i > 0 and not f.entrypoint):
                continue
            # A program absent from the image may come from a volume, on every architecture.
            starts = f.entrypoint and f.check is not Check.MISSING_ENTRYPOINT
            key = f"{f.path}\0{f.message}"
            if starts or key not in seen:
                seen[key] = (f.path, f.message, starts)
    return sorted(seen.values(), key=lambda s: (not s[2], s[0]))


def _select(images: list[ImageSource], platform: Platform) -> ImageSource | None:
    for image in images:
        if (image.platform or image.config_platform() or platform).matches(platform):
            return image
    return None


def _lines(seen: list[Seen]) -> str:
    text = "; ".join(f"{path}: {message}" for path, message, _ in seen[:MAX_WHY])
    more = f" (and {len(seen) - MAX_WHY} more)" if len(seen) > MAX_WHY else ""
    return text + more
