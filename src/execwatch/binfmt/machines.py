"""ELF header fields -> OCI architecture, following the table in docs/FACTS (and binutils).

Kept apart from the reader so the mapping can be tested without building files.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

EM_386 = 3
EM_MIPS = 8
EM_PPC = 20
EM_PPC64 = 21
EM_S390 = 22
EM_ARM = 40
EM_SPARCV9 = 43
EM_X86_64 = 62
EM_AARCH64 = 183
EM_RISCV = 243
EM_LOONGARCH = 258

ELFCLASS32 = 1
ELFCLASS64 = 2

EF_ARM_EABIMASK = 0xFF000000
EF_ARM_ABI_FLOAT_SOFT = 0x200
EF_ARM_ABI_FLOAT_HARD = 0x400
EF_MIPS_ABI2 = 0x20
EF_RISCV_FLOAT_ABI = 0x6

_OS_BY_OSABI = {2: "netbsd", 6: "solaris", 9: "freebsd", 12: "openbsd"}
NT_ABI_TAG = 1  # NT_GNU_ABI_TAG, NT_NETBSD_IDENT, NT_OPENBSD_IDENT, NT_FREEBSD_ABI_TAG
_OS_BY_NOTE_NAME = {
    b"NetBSD": "netbsd",
    b"OpenBSD": "openbsd",
    b"FreeBSD": "freebsd",
    b"DragonFly": "dragonfly",
}
_OS_BY_GNU_ABI_TAG = {1: "hurd", 2: "solaris", 3: "freebsd"}  # 0 is Linux
_NOTE_HEADER = {True: struct.Struct("<III"), False: struct.Struct(">III")}


@dataclass(frozen=True)
class Architecture:
    """What the header says: an OCI name when there is one, a readable label always."""

    label: str
    oci: str | None


def classify(machine: int, elf_class: int, little_endian: bool, flags: int) -> Architecture:
    """Name the architecture of an ELF header; `oci` is None when OCI has no name for it."""
    is64 = elf_class == ELFCLASS64

    def named(name: str) -> Architecture:
        return Architecture(name, name)

    if machine == EM_X86_64:
        return named("amd64") if is64 else Architecture("x32", None)
    if machine == EM_386 and not is64:
        return named("386")
    if machine == EM_AARCH64 and is64:
        return named("arm64") if little_endian else Architecture("aarch64_be", None)
    if machine == EM_ARM and not is64:
        return named("arm") if little_endian else Architecture("armeb", None)
    if machine == EM_PPC64 and is64:
        return named("ppc64le") if little_endian else named("ppc64")
    if machine == EM_PPC and not is64:
        return Architecture("ppc (32-bit)", None)
    if machine == EM_S390:
        return named("s390x") if is64 else Architecture("s390 (31-bit)", None)
    if machine == EM_RISCV:
        return named("riscv64") if is64 else Architecture("riscv32", None)
    if machine == EM_MIPS:
        if not is64 and flags & EF_MIPS_ABI2:
            return Architecture("mips64 n32" + ("le" if little_endian else ""), None)
        if is64:
            return named("mips64le" if little_endian else "mips64")
        return named("mipsle" if little_endian else "mips")
    if machine == EM_LOONGARCH:
        return named("loong64") if is64 else Architecture("loongarch32", None)
    if machine == EM_SPARCV9 and is64:
        return Architecture("sparc64", None)
    return Architecture(f"unknown-machine-{machine}", None)


def os_from_osabi(osabi: int) -> str:
    """ELFOSABI_NONE (0) and ELFOSABI_GNU (3) both mean Linux in practice."""
    return _OS_BY_OSABI.get(osabi, "linux")


def abi_note_os(data: bytes, little: bool) -> str | None:
    """The OS an ABI tag note of one PT_NOTE segment names; None for Linux's or none. The
    loop takes at least 12 bytes a note: bounded by len(data)."""
    header = _NOTE_HEADER[little]
    pos = 0
    while pos + header.size <= len(data):
        namesz, descsz, kind = header.unpack_from(data, pos)
        name_at = pos + header.size
        desc_at = name_at + _up4(namesz)
        name = data[name_at : name_at + namesz].rstrip(b"\0")
        if kind == NT_ABI_TAG and name in _OS_BY_NOTE_NAME:
            return _OS_BY_NOTE_NAME[name]
        if kind == NT_ABI_TAG and name == b"GNU" and descsz >= 4 and desc_at + 4 <= len(data):
            tag = struct.unpack_from(header.format[0] + "I", data, desc_at)[0]
            return _OS_BY_GNU_ABI_TAG.get(tag)
        pos = desc_at + _up4(descsz)
    return None


def _up4(n: int) -> int:
    return (n + 3) & ~3


def arm_variant_from_cpu_arch(tag_cpu_arch: int) -> str:
    """`.ARM.attributes` Tag_CPU_arch -> OCI variant (ARM IHI 0045 numbering).

    0-5 are v4..v5TEJ, 6-9 the v6 family, 10 is v7; 11-13 are M profiles (v6-M, v6S-M,
    v7E-M) mapped to their base level; 14 and later are v8-A/R/M and newer.
    """
    if tag_cpu_arch <= 5:
        return "v5"
    if tag_cpu_arch <= 9 or tag_cpu_arch in (11, 12):
        return "v6"
    if tag_cpu_arch in (10, 13):
        return "v7"
    return "v8"


def arm_float_abi(flags: int) -> str | None:
    """'hard', 'soft' or None (Go and old-ABI binaries carry no float bits)."""
    if flags & EF_ARM_ABI_FLOAT_HARD:
        return "hard"
    if flags & EF_ARM_ABI_FLOAT_SOFT:
        return "soft"
    return None
