"""Records that flow from the checks to the reporters."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


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


class Check(enum.StrEnum):
    """Stable check ids: they appear in JSON, SARIF rule ids and JUnit test names."""

    ARCH_MISMATCH = "arch-mismatch"
    MISSING_INTERPRETER = "missing-interpreter"
    MISSING_LIBRARY = "missing-library"
    MISSING_SYMBOL_VERSION = "missing-symbol-version"
    MISSING_SYMBOL = "missing-symbol"
    LIBC_MISMATCH = "libc-mismatch"
    MISSING_SHEBANG_INTERPRETER = "missing-shebang-interpreter"
    SHEBANG_CRLF = "shebang-crlf"
    ENV_NOT_ON_PATH = "env-not-on-PATH"
    NOT_STATIC = "not-static"
    MISSING_ENTRYPOINT = "missing-entrypoint"
    CORRUPT_BINARY = "corrupt-binary"
    CPU_LEVEL = "cpu-level"


CHECK_DESCRIPTIONS: dict[Check, str] = {
    Check.ARCH_MISMATCH: "ELF machine, class, endianness or variant does not run on the platform",
    Check.MISSING_INTERPRETER: "the ELF loader named in PT_INTERP is absent from the image",
    Check.MISSING_LIBRARY: "a DT_NEEDED library cannot be found by the image's loader rules",
    Check.MISSING_SYMBOL_VERSION: "a required symbol version is not defined by the library",
    Check.MISSING_SYMBOL: "an imported symbol no loaded library exports (a root on disk only)",
    Check.LIBC_MISMATCH: "a glibc binary on a musl image, or the reverse (gcompat included)",
    Check.MISSING_SHEBANG_INTERPRETER: "the #! interpreter is absent from the image",
    Check.SHEBANG_CRLF: "the #! line ends in CR: the kernel looks for an interpreter ending in \\r",
    Check.ENV_NOT_ON_PATH: "the command given to #!/usr/bin/env is not on the image's PATH",
    Check.NOT_STATIC: "the executable is dynamically linked but --require-static was given",
    Check.MISSING_ENTRYPOINT: "the image's entrypoint/cmd program does not exist",
    Check.CORRUPT_BINARY: "the file starts like an ELF but its headers are malformed",
    Check.CPU_LEVEL: "an executable or a library it loads needs an x86-64 level the CPUs lack",
}


@dataclass(frozen=True)
class Finding:
    check: Check
    severity: Severity
    path: str
    platform: str
    message: str
    entrypoint: bool = False


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
