"""Where each C library puts its dynamic loader, and how to tell them apart.

glibc paths are from glibc's sysdeps (`*/ldsodefs.h` / `shlib-versions`), checked against the
PT_INTERP of Debian's own binaries in the tests; musl's loader is always
`/lib/ld-musl-<arch>.so.1` with the arch names of musl's `arch/*/reloc.h` (LDSO_ARCH).
"""

from __future__ import annotations

import posixpath
from typing import Literal

from execwatch.binfmt import machines
from execwatch.binfmt.elf import ElfInfo

LibcFlavor = Literal["glibc", "musl"]

# (OCI architecture or label, float ABI for arm) -> glibc PT_INTERP
GLIBC_LOADERS: dict[str, str] = {
    "amd64": "/lib64/ld-linux-x86-64.so.2",
    "x32": "/libx32/ld-linux-x32.so.2",
    "386": "/lib/ld-linux.so.2",
    "arm64": "/lib/ld-linux-aarch64.so.1",
    "aarch64_be": "/lib/ld-linux-aarch64_be.so.1",
    "arm/hard": "/lib/ld-linux-armhf.so.3",
    "arm/soft": "/lib/ld-linux.so.3",
    "ppc64le": "/lib64/ld64.so.2",
    "ppc64": "/lib64/ld64.so.1",
    "ppc (32-bit)": "/lib/ld.so.1",
    "s390x": "/lib/ld64.so.1",
    "s390 (31-bit)": "/lib/ld.so.1",
    "riscv64": "/lib/ld-linux-riscv64-lp64d.so.1",
    "mips64le": "/lib64/ld.so.1",
    "mips64": "/lib64/ld.so.1",
    "mipsle": "/lib/ld.so.1",
    "mips": "/lib/ld.so.1",
    "loong64": "/lib64/ld-linux-loongarch-lp64d.so.1",
}

# OCI architecture or label -> musl LDSO_ARCH (hard-float arm adds "hf").
MUSL_ARCH: dict[str, str] = {
    "amd64": "x86_64",
    "x32": "x32",
    "386": "i386",
    "arm64": "aarch64",
    "aarch64_be": "aarch64_be",
    "arm": "arm",
    "armeb": "armeb",
    "ppc64le": "powerpc64le",
    "ppc64": "powerpc64",
    "ppc (32-bit)": "powerpc",
    "s390x": "s390x",
    "riscv64": "riscv64",
    "mips64le": "mips64el",
    "mips64": "mips64",
    "mipsle": "mipsel",
    "mips": "mips",
    "loong64": "loongarch64",
}

_GLIBC_NAMES = frozenset(posixpath.basename(p) for p in GLIBC_LOADERS.values()) | {
    "ld-linux-riscv64-lp64.so.1",
    "ld-linux-loongarch-lp64s.so.1",
}


def libc_flavor(interpreter: str | None) -> LibcFlavor | None:
    """Which C library a PT_INTERP belongs to, judged by the loader's file name."""
    if not interpreter:
        return None
    name = posixpath.basename(interpreter)
    if name.startswith("ld-musl-") and name.endswith(".so.1"):
        return "musl"
    if name in _GLIBC_NAMES:
        return "glibc"
    return None


def musl_arch(info: ElfInfo) -> str | None:
    """musl's name for the architecture of `info` (the <arch> in ld-musl-<arch>.so.1)."""
    base = MUSL_ARCH.get(info.arch)
    if base is not None and info.machine == machines.EM_ARM and info.float_abi == "hard":
        return base + "hf"
    return base


def musl_loader(info: ElfInfo) -> str | None:
    arch = musl_arch(info)
    return None if arch is None else f"/lib/ld-musl-{arch}.so.1"


def glibc_loader(info: ElfInfo) -> str | None:
    key = info.arch
    if info.machine == machines.EM_ARM:
        key = "arm/soft" if info.float_abi == "soft" else "arm/hard"
    return GLIBC_LOADERS.get(key)


def expected_loader(info: ElfInfo, flavor: LibcFlavor) -> str | None:
    """The PT_INTERP a `flavor` toolchain writes for this architecture."""
    return glibc_loader(info) if flavor == "glibc" else musl_loader(info)


def loader_flavor(real_path: str, info: ElfInfo | None) -> LibcFlavor | None:
    """Which C library a loader file really is, from its resolved path and soname.

    gcompat names musl's loader /lib64/ld-linux-x86-64.so.2: the link's name says glibc,
    its target (ld-musl-*, or libc.so under a musl directory) says musl."""
    soname = info.soname if info is not None else None
    if "musl" in real_path or (soname is not None and "musl" in soname):
        return "musl"
    if soname is not None and soname in _GLIBC_NAMES:
        return "glibc"
    return libc_flavor(real_path)
