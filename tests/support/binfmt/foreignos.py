"""Executables of other operating systems for the tests: the real Go cross-compiles that
dev/build-foreign-os.sh caches, and what is built from them here (a universal Mach-O of
two real slices, an ELF with a BSD's ABI note)."""

from __future__ import annotations

import struct
from pathlib import Path

CACHE = Path(__file__).resolve().parents[3] / ".cache" / "foreign-os"
# name in the cache -> (GOOS, the OCI architecture, the format) it holds
BUILT = {
    "hello-darwin-amd64": ("darwin", "amd64", "Mach-O"),
    "hello-darwin-arm64": ("darwin", "arm64", "Mach-O"),
    "hello-windows-amd64.exe": ("windows", "amd64", "PE"),
    "hello-freebsd-amd64": ("freebsd", "amd64", "ELF"),
    "hello-netbsd-amd64": ("netbsd", "amd64", "ELF"),
    "hello-openbsd-amd64": ("openbsd", "amd64", "ELF"),
}
FAT_ALIGN = 14  # 2**14, as lipo aligns arm64 slices


def built() -> dict[str, Path]:
    """The cached cross-compiles; fails loudly when dev/build-foreign-os.sh has not run."""
    if not (CACHE / ".complete-v1").exists():
        raise AssertionError(f"{CACHE} is missing: run dev/build-foreign-os.sh (make test does)")
    return {name: CACHE / name for name in BUILT}


def universal(*slices: bytes) -> bytes:
    """A fat (universal) Mach-O of thin ones, as lipo lays it out: the big-endian header,
    one fat_arch each (cputype and cpusubtype from the slice), slices 2**14-aligned."""
    header = struct.pack(">II", 0xCAFEBABE, len(slices))
    offset, entries, body = 1 << FAT_ALIGN, b"", b""
    for data in slices:
        cputype, subtype = struct.unpack_from("<ii", data, 4)
        entries += struct.pack(">iiIII", cputype, subtype, offset, len(data), FAT_ALIGN)
        pad = -len(data) % (1 << FAT_ALIGN)
        body += data + bytes(pad)
        offset += len(data) + pad
    start = header + entries
    return start + bytes((1 << FAT_ALIGN) - len(start)) + body


def elf_with_note(name: bytes, desc: bytes, kind: int = 1, osabi: int = 0) -> bytes:
    """A static x86-64 ELF executable whose one PT_NOTE segment holds one note: how NetBSD
    and OpenBSD mark their binaries (OS/ABI 0, an ABI tag note)."""
    namesz = len(name) + 1
    note = struct.pack("<III", namesz, len(desc), kind) + name + b"\0"
    note += bytes(-len(note) % 4) + desc + bytes(-len(desc) % 4)
    at = 64 + 56
    ident = b"\x7fELF\x02\x01\x01" + bytes([osabi]) + bytes(8)
    ehdr = struct.pack("<16sHHIQQQIHHHHHH", ident, 2, 62, 1, 0x400000, 64, 0, 0, 64, 56, 1,
                       64, 0, 0)  # fmt: skip
    phdr = struct.pack("<IIQQQQQQ", 4, 4, at, 0x400000 + at, 0x400000 + at, len(note),
                       len(note), 4)  # fmt: skip
    return ehdr + phdr + note
