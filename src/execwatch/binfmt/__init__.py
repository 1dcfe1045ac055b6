"""Everything execwatch knows about executable formats: ELF, `#!` scripts, platforms, loaders.

This is the one place with that knowledge. The runtime diagnosis (why did this exec fail
on this node?) and `execwatch scan` (will these executables start on that platform?) both
call it, so they cannot disagree about what a binary is.
"""

from execwatch.binfmt.elf import ElfInfo, VersionNeed, VersionRequirement, read_elf
from execwatch.binfmt.errors import BinfmtError
from execwatch.binfmt.loaders import (
    GLIBC_LOADERS,
    LibcFlavor,
    expected_loader,
    glibc_loader,
    libc_flavor,
    loader_flavor,
    musl_arch,
    musl_loader,
)
from execwatch.binfmt.platform import Platform, can_execute, node_platform
from execwatch.binfmt.shebang import Shebang, parse_shebang, sniff

__all__ = [
    "GLIBC_LOADERS",
    "BinfmtError",
    "ElfInfo",
    "LibcFlavor",
    "Platform",
    "Shebang",
    "VersionNeed",
    "VersionRequirement",
    "can_execute",
    "expected_loader",
    "glibc_loader",
    "libc_flavor",
    "loader_flavor",
    "musl_arch",
    "musl_loader",
    "node_platform",
    "parse_shebang",
    "read_elf",
    "sniff",
]
