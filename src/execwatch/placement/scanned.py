"""Verdicts for placement from the scan engine: what a container's image runs on, per node
architecture, through audit's image auditor (digest resolution, one scan per digest and
platform in a process of its own, the verdict cache on disk).

What decides is what the pod starts: the image's entrypoint, followed through `#!` and
`env`, its loader and libraries (the scan's entrypoint findings). Other binaries' findings
are kept in the reasons but decide only with `strict`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from execwatch.audit.engine import ImageAuditor, Status, Verdict
from execwatch.placement.controller import VerdictUnavailable
from execwatch.placement.decision import ContainerVerdict, Outcome

MAX_WHY = 3


@dataclass
class ScannedVerdicts:
    auditor: ImageAuditor
    arches: Callable[[], Iterable[str]]
    strict: bool = False

    def judge(
        self, pod: Mapping[str, Any], container: Mapping[str, Any], deadline: float
    ) -> ContainerVerdict:
        image = str(container.get("image") or "")
        outcomes: dict[str, Outcome] = {}
        why: dict[str, str] = {}
        for arch in self.arches():
            verdict = self.auditor.verdict(image, arch)
            if verdict.status is Status.ERROR:
                raise VerdictUnavailable(verdict.message or f"{image}: could not be checked")
            outcomes[arch], reason = self._outcome(verdict)
            if reason:
                why[arch] = reason
        return ContainerVerdict(str(container.get("name") or ""), image, outcomes, why)

    def _outcome(self, verdict: Verdict) -> tuple[Outcome, str]:
        if verdict.status is Status.MISSING_PLATFORM:
            return Outcome.FAILS, verdict.message or f"no {verdict.platform} image"
        deciding = [f for f in verdict.findings if self.strict or f.get("entrypoint")]
        if not deciding:
            return Outcome.RUNS, ""
        reasons = "; ".join(f"{f['path']}: {f['message']}" for f in deciding[:MAX_WHY])
        more = f" (and {len(deciding) - MAX_WHY} more)" if len(deciding) > MAX_WHY else ""
        return Outcome.FAILS, reasons + more
