"""Records that flow from the checks to the reporters."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from execwatch.scan.vocabulary import Check


class Severity(enum.IntEnum):
    """Ordered so that `--fail-on warning` means "warning or worse"."""

    NOTE = 1
    WARNING = 2
    ERROR = 3

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, text: str) -> Severity:
        return cls[text.upper()]


@dataclass(frozen=True)
class Finding:
    check: Check
    severity: Severity
    path: str
    platform: str
    message: str
    entrypoint: bool = False
    source: str = "static"  # "run": the outcome of starting it (--run)
    disagreement: str | None = None  # a run that contradicts the static verdict, named


@dataclass
class Stats:
    files: int = 0
    executables: int = 0
    elf: int = 0
    scripts: int = 0
    bytes_read: int = 0
    seconds: float = 0.0


@dataclass
class ImageResult:
    """The outcome for one platform of one input."""

    source: str
    platform: str
    entrypoint: list[str] | None = None
    findings: list[Finding] = field(default_factory=list)
    stats: Stats = field(default_factory=Stats)
    notes: list[str] = field(default_factory=list)
    digest: str | None = None  # the image's manifest digest, when it has one

    def identity(self) -> dict[str, str | None]:
        """What names this image among several in one input."""
        return {"source": self.source, "platform": self.platform, "digest": self.digest}


@dataclass
class ScanReport:
    target: str
    results: list[ImageResult] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # e.g. nothing to check, when allowed

    @property
    def findings(self) -> list[Finding]:
        return [f for r in self.results for f in r.findings]

    def worst(self) -> Severity | None:
        return max((f.severity for f in self.findings), default=None)
