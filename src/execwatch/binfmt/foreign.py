"""Executables of other operating systems: what a Linux kernel refuses with ENOEXEC (Mach-O,
PE/COFF, a.out) or runs into a loader it lacks (an ELF whose OS/ABI or notes name another
OS). Each is named with its OS and architectures, for the node's diagnosis and the scan.

Every read is bounded: at most MAX_READS reads of MAX_READ_BYTES each, at offsets below
MAX_HEADER_OFFSET, whatever the file claims (a fat header's count, PE's e_lfanew).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO

from execwatch.binfmt.elf import ElfInfo

MAX_READS = 2
MAX_READ_BYTES = 1024
MAX_HEADER_OFFSET = 4096  # PE's e_lfanew: 0x40..0x200 in real files
MAX_FAT_ARCHS = 20  # more is Java's CAFEBABE (class file major version >= 45), not Mach-O

OS_NAMES = {
    "darwin": "macOS",
    "windows": "Windows",
    "freebsd": "FreeBSD",
    "netbsd": "NetBSD",
    "openbsd": "OpenBSD",
    "solaris": "Solaris",
    "illumos": "illumos",
    "dragonfly": "DragonFly BSD",
    "hurd": "GNU Hurd",
    "uefi": "UEFI",
    "unix": "pre-ELF Unix",
}
# For a person: what `file` and the platforms' own docs call the architectures.
ARCH_WORDS = {"amd64": "x86-64", "386": "x86", "arm64": "arm64", "arm": "arm"}

# Mach-O (<mach/machine.h>): cputype; CPU_ARCH_ABI64 0x01000000, CPU_ARCH_ABI64_32 0x02000000
_MACHO_CPU = {
    7: "386",
    0x01000007: "amd64",
    12: "arm",
    0x0100000C: "arm64",
    0x0200000C: "arm64_32",
    18: "ppc",
    0x01000012: "ppc64",
}
MH_EXECUTE = 2
_MACHO_THIN = {
    b"\xfe\xed\xfa\xce": ">",
    b"\xce\xfa\xed\xfe": "<",
    b"\xfe\xed\xfa\xcf": ">",
    b"\xcf\xfa\xed\xfe": "<",
}
_FAT = {b"\xca\xfe\xba\xbe": 20, b"\xca\xfe\xba\xbf": 32}  # fat_arch, fat_arch_64 sizes

# PE/COFF (IMAGE_FILE_MACHINE_*), characteristics and the EFI subsystems
_PE_MACHINE = {
    0x014C: "386",
    0x8664: "amd64",
    0xAA64: "arm64",
    0x01C0: "arm",
    0x01C4: "arm",
    0x0200: "ia64",
    0x5064: "riscv64",
    0x6264: "loong64",
}
IMAGE_FILE_EXECUTABLE_IMAGE = 0x0002
IMAGE_FILE_DLL = 0x2000
_EFI_SUBSYSTEMS = frozenset({10, 11, 12, 13})

# a.out: Linux's N_MAGIC in the low 16 bits of a little-endian a_info, the machine above
# it; the BSDs' a_midmag, big-endian: flags (6 bits), machine id (10), magic (16).
_AOUT_MAGICS = frozenset({0o407, 0o410, 0o413, 0o314})
_AOUT_LINUX_MACHINE = {100: "386", 2: "m68k", 3: "sparc", 103: "arm"}
_AOUT_BSD_MID = {134: "386", 135: "m68k", 137: "sparc", 138: "ppc", 143: "arm"}


@dataclass(frozen=True)
class ForeignBinary:
    """An executable format Linux does not run, or an ELF built for another OS."""

    os: str  # GOOS spelling where there is one: darwin, windows, freebsd ...
    format: str  # Mach-O, PE, a.out, ELF
    archs: tuple[str, ...]  # OCI names where known; several for a universal Mach-O
    executable: bool = True  # False: a library, bundle or object of that OS

    @property
    def os_name(self) -> str:
        return OS_NAMES.get(self.os, self.os)

    @property
    def arch(self) -> str:
        """The architectures as one label (metrics' binary_arch): amd64, amd64+arm64."""
        return "+".join(self.archs) or "unknown"

    def describe(self) -> str:
        """'a macOS x86-64 executable (Mach-O)', 'a Windows arm64 library (PE)'."""
        kind = "executable" if self.executable else "library"
        if len(self.archs) > 1:
            words = " and ".join(ARCH_WORDS.get(a, a) for a in self.archs)
            return f"a {self.os_name} universal {kind} ({self.format}: {words})"
        word = ARCH_WORDS.get(self.archs[0], self.archs[0]) if self.archs else "unknown-CPU"
        article = "an" if self.os_name[:1] in "AEIOUaeiou" else "a"
        return f"{article} {self.os_name} {word} {kind} ({self.format})"

    def hint(self) -> str:
        if self.os == "unix":
            return "Linux runs ELF only: rebuild it"
        if self.os == "uefi":
            return "a firmware application, not a Linux program"
        return f"built with GOOS={self.os}?"

    def detail(self) -> str:
        return f"{self.describe()}: {self.hint()}"


class _Reads:
    """The budget of one identification: MAX_READS reads, each clipped to MAX_READ_BYTES."""

    def __init__(self, read: Callable[[int, int], bytes]) -> None:
        self._read = read
        self.left = MAX_READS

    def __call__(self, offset: int, length: int) -> bytes:
        if self.left <= 0 or offset > MAX_HEADER_OFFSET:
            return b""
        self.left -= 1
        return self._read(offset, min(length, MAX_READ_BYTES))


def identify_file(f: IO[bytes]) -> ForeignBinary | None:
    """Identify a seekable file (its position is not kept)."""

    def read(offset: int, length: int) -> bytes:
        f.seek(offset)
        return f.read(length)

    return identify(read)


def identify_stream(head: bytes, rest: IO[bytes]) -> ForeignBinary | None:
    """Identify a file from its first bytes and the stream just past them, read forward
    only (a tar member), never past MAX_HEADER_OFFSET + MAX_READ_BYTES."""
    buf = bytearray(head)

    def read(offset: int, length: int) -> bytes:
        end = min(offset + length, MAX_HEADER_OFFSET + MAX_READ_BYTES)
        if end > len(buf):
            buf.extend(rest.read(end - len(buf)))
        return bytes(buf[offset:end])

    return identify(read)


def identify(read: Callable[[int, int], bytes]) -> ForeignBinary | None:
    """Mach-O (thin or universal), PE/COFF or a.out, from `read(offset, length)`; None for
    anything else, ELF included (see of_elf)."""
    reads = _Reads(read)
    head = reads(0, MAX_READ_BYTES)
    magic = head[:4]
    if magic in _MACHO_THIN:
        return _macho(head, _MACHO_THIN[magic])
    if magic in _FAT:
        return _fat(head, _FAT[magic])
    if head[:2] == b"MZ":
        return _pe(head, reads)
    return _aout(head)


def of_elf(info: ElfInfo) -> ForeignBinary | None:
    """An ELF whose OS/ABI byte or ABI note names another OS than Linux."""
    platform = info.platform
    if platform is None or platform.os == "linux":
        return None
    return ForeignBinary(platform.os, "ELF", (info.arch,), info.is_executable)


def _macho(head: bytes, order: str) -> ForeignBinary | None:
    if len(head) < 16:
        return None
    cputype, _, filetype = struct.unpack_from(order + "iiI", head, 4)
    arch = _MACHO_CPU.get(cputype & 0xFFFFFFFF)
    if arch is None:
        return None
    return ForeignBinary("darwin", "Mach-O", (arch,), filetype == MH_EXECUTE)


def _fat(head: bytes, entry: int) -> ForeignBinary | None:
    """A universal binary: its slices' architectures, from the header (big-endian)."""
    if len(head) < 8:
        return None
    count = struct.unpack_from(">I", head, 4)[0]
    if not 0 < count <= MAX_FAT_ARCHS or len(head) < 8 + count * entry:
        return None
    archs = []
    for i in range(count):
        cputype = struct.unpack_from(">I", head, 8 + i * entry)[0]
        arch = _MACHO_CPU.get(cputype)
        if arch is None:
            return None
        if arch not in archs:
            archs.append(arch)
    return ForeignBinary("darwin", "Mach-O", tuple(archs))


def _pe(head: bytes, reads: _Reads) -> ForeignBinary | None:
    """`MZ`, e_lfanew at 0x3c, `PE\\0\\0`, then the COFF header and the optional header's
    subsystem (an EFI application is not a Windows program)."""
    if len(head) < 0x40:
        return None
    lfanew = struct.unpack_from("<I", head, 0x3C)[0]
    need = 24 + 70  # signature, COFF header, the optional header up to Subsystem
    pe = head[lfanew : lfanew + need] if lfanew + need <= len(head) else reads(lfanew, need)
    if len(pe) < 24 or pe[:4] != b"PE\0\0":
        return None
    machine = struct.unpack_from("<H", pe, 4)[0]
    characteristics = struct.unpack_from("<H", pe, 22)[0]
    subsystem = struct.unpack_from("<H", pe, 24 + 68)[0] if len(pe) >= need else 0
    executable = bool(characteristics & IMAGE_FILE_EXECUTABLE_IMAGE) and not (
        characteristics & IMAGE_FILE_DLL
    )
    arch = _PE_MACHINE.get(machine, f"machine-0x{machine:04x}")
    os_name = "uefi" if subsystem in _EFI_SUBSYSTEMS else "windows"
    return ForeignBinary(os_name, "PE", (arch,), executable)


def _aout(head: bytes) -> ForeignBinary | None:
    """A known machine with a known magic only: two bytes alone say nothing."""
    if len(head) < 32:  # struct exec: eight 32-bit words
        return None
    little = struct.unpack_from("<I", head)[0]
    if little & 0xFFFF in _AOUT_MAGICS and (arch := _AOUT_LINUX_MACHINE.get(little >> 16 & 0xFF)):
        return ForeignBinary("unix", "a.out", (arch,))
    big = struct.unpack_from(">I", head)[0]
    if big & 0xFFFF in _AOUT_MAGICS and (arch := _AOUT_BSD_MID.get(big >> 16 & 0x3FF)):
        return ForeignBinary("unix", "a.out", (arch,))
    return None
