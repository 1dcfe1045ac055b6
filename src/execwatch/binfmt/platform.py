"""OCI platforms (`linux/arm/v7`) and which CPU can run which binary.

Names follow the OCI image spec, which takes them from GOARCH, and are normalised the way
containerd's `platforms.Normalize` does, so that a platform parsed from a manifest, from the
command line and from an ELF header compare equal when they mean the same thing.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass

_KNOWN_OS = frozenset(
    {"linux", "windows", "darwin", "freebsd", "netbsd", "openbsd", "solaris", "illumos"}
)

# Distribution and kernel spellings -> (OCI architecture, implied variant).
_ARCH_ALIASES: dict[str, tuple[str, str | None]] = {
    "x86_64": ("amd64", None),
    "x86-64": ("amd64", None),
    "amd64": ("amd64", None),
    "i386": ("386", None),
    "i486": ("386", None),
    "i586": ("386", None),
    "i686": ("386", None),
    "x86": ("386", None),
    "386": ("386", None),
    "aarch64": ("arm64", None),
    "arm64": ("arm64", None),
    "armhf": ("arm", "v7"),
    "armel": ("arm", "v6"),
    "arm": ("arm", None),
    "armv5l": ("arm", "v5"),
    "armv6l": ("arm", "v6"),
    "armv7l": ("arm", "v7"),
    "armv8l": ("arm", "v8"),
    "ppc64el": ("ppc64le", None),
    "ppc64le": ("ppc64le", None),
    "ppc64": ("ppc64", None),
    "s390x": ("s390x", None),
    "riscv64": ("riscv64", None),
    "mips64el": ("mips64le", None),
    "mips64le": ("mips64le", None),
    "mips64": ("mips64", None),
    "mipsel": ("mipsle", None),
    "mipsle": ("mipsle", None),
    "mips": ("mips", None),
    "loongarch64": ("loong64", None),
    "loong64": ("loong64", None),
}

# Every architecture name the OCI image spec (GOARCH) knows and this module can produce.
OCI_ARCHITECTURES = frozenset(arch for arch, _variant in _ARCH_ALIASES.values())

_NAME = re.compile(r"^[a-z0-9_.-]+$")


@dataclass(frozen=True)
class Platform:
    """An OCI platform: operating system, architecture and optional variant."""

    os: str
    architecture: str
    variant: str | None = None

    def __str__(self) -> str:
        parts = [self.os, self.architecture]
        if self.variant:
            parts.append(self.variant)
        return "/".join(parts)

    @classmethod
    def parse(cls, text: str) -> Platform:
        """Parse `os/arch[/variant]`, `arch/variant` or a bare `arch`, then normalise it.

        Raises ValueError with a one-line message on anything else.
        """
        parts = text.strip().lower().split("/")
        if not all(parts) or not all(_NAME.fullmatch(p) for p in parts) or len(parts) > 3:
            raise ValueError(f"invalid platform {text!r}: expected os/arch[/variant]")
        if len(parts) == 1:
            os_name, arch, variant = "linux", parts[0], None
        elif len(parts) == 2 and parts[0] in _KNOWN_OS:
            os_name, arch, variant = parts[0], parts[1], None
        elif len(parts) == 2:
            os_name, arch, variant = "linux", parts[0], parts[1]
        else:
            os_name, arch, variant = parts
        return cls.normalised(os_name, arch, variant)

    @classmethod
    def parse_known(cls, text: str) -> Platform:
        """parse(), and refuse an operating system or architecture no OCI image names.

        For a platform someone asked for: a typo such as `linux/amd46` would otherwise be
        checked as a CPU that runs nothing, and every binary reported as the wrong one.
        """
        platform = cls.parse(text)
        if platform.os not in _KNOWN_OS:
            known = ", ".join(sorted(_KNOWN_OS))
            raise ValueError(f"invalid platform {text!r}: unknown os {platform.os!r} ({known})")
        if platform.architecture not in OCI_ARCHITECTURES:
            arch, known = platform.architecture, ", ".join(sorted(OCI_ARCHITECTURES))
            raise ValueError(f"invalid platform {text!r}: unknown architecture {arch!r} ({known})")
        return platform

    @classmethod
    def normalised(cls, os_name: str, architecture: str, variant: str | None = None) -> Platform:
        """Build a platform from possibly unnormalised parts (e.g. an image config's)."""
        os_name = os_name.lower() or "linux"
        if os_name == "macos":
            os_name = "darwin"
        arch, implied = _ARCH_ALIASES.get(architecture.lower(), (architecture.lower(), None))
        var = (variant or "").lower() or implied
        if var and var.isdigit():
            var = f"v{var}"
        if (arch, var) in (("arm64", "v8"), ("amd64", "v1")):
            var = None
        elif arch == "arm" and var is None:
            var = "v7"
        return cls(os_name, arch, var or None)

    def matches(self, other: Platform) -> bool:
        """Same os and architecture, and the same variant when both name one."""
        if (self.os, self.architecture) != (other.os, other.architecture):
            return False
        return self.variant is None or other.variant is None or self.variant == other.variant


def node_platform(machine: str | None = None) -> Platform:
    """The platform of this machine, from `uname -m` (or the given machine string)."""
    raw = (machine or os.uname().machine).lower()
    if raw in ("mips64", "mips") and sys.byteorder == "little" and machine is None:
        raw += "el"
    arch, variant = _ARCH_ALIASES.get(raw, (raw, None))
    return Platform("linux", arch, variant)


def _arm_level(variant: str | None) -> int:
    if variant and variant.startswith("v") and variant[1:].isdigit():
        return int(variant[1:])
    return 7


def can_execute(node: Platform, binary: Platform, *, arm32_compat: bool = False) -> bool:
    """Whether a node's CPU and kernel run a binary natively (no binfmt_misc emulation).

    The rules are deliberately few:
    - same architecture; for arm the node's variant must be at least the binary's
      (a binary without a variant, e.g. Go's, is assumed to fit);
    - an amd64 node runs 386 binaries (IA32 emulation is on in every mainstream kernel);
    - an arm64 node runs 32-bit arm binaries only when `arm32_compat` says the CPU and
      kernel have AArch32 support, which many server CPUs lack.
    ppc64 and ppc64le, mips64 and mips64le are different architectures.
    """
    if node.os != binary.os:
        return False
    if node.architecture == binary.architecture:
        if node.architecture == "arm" and binary.variant is not None:
            return _arm_level(node.variant) >= _arm_level(binary.variant)
        return True
    if node.architecture == "amd64" and binary.architecture == "386":
        return True
    return node.architecture == "arm64" and binary.architecture == "arm" and arm32_compat
