"""Read what exec and the dynamic loader look at in an ELF file, and nothing more.

The reader unpacks the ELF header and the tables (program headers, dynamic entries, version
records, which a hostile file can make thousands of entries long) with `struct`: pyelftools'
construct-based header parse was a fifth of a scan's ELF reading, and importing it a sixth
of `execwatch scan`'s start-up; it stays the tests' oracle for these formats. It reads the
ELF header, the program header table, PT_INTERP, PT_DYNAMIC and the dynamic string and
version tables through the PT_LOAD mapping, as ld.so does, never whole sections of unknown
size, so a 2 GB file costs a few reads.

Every parse runs on a budget (`ElfLimits`): bytes read, dynamic entries, distinct needed
libraries and search directories, decoded string bytes, version records and wall time.
Each string is decoded once per offset, however many entries point at it. A file that
points past its end raises TruncatedFile, one that exceeds the budget ParseLimitExceeded (both
BinfmtError): never a huge allocation, a hang or another exception.
"""

from __future__ import annotations

import functools
import os
import struct
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, BinaryIO, NamedTuple

from execwatch.binfmt import isa, machines
from execwatch.binfmt.errors import BinfmtError, ParseLimitExceeded, TruncatedFile
from execwatch.binfmt.platform import Platform

ELF_MAGIC = b"\x7fELF"
_FS_ENCODING = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()
ET_EXEC = 2
ET_DYN = 3

MAX_PHDR_BYTES = 65536  # fs/binfmt_elf.c refuses larger program header tables
MAX_INTERP_BYTES = 4096  # PATH_MAX, the kernel's limit for PT_INTERP
MAX_ARM_ATTRIBUTES_BYTES = 65536
MAX_SECTION_HEADERS_BYTES = 256 << 10  # .ARM.attributes is optional: past this, no variant

PT_LOAD, PT_DYNAMIC, PT_INTERP, PT_NOTE = 1, 2, 3, 4
MAX_NOTE_SEGMENTS = 16  # PT_NOTE segments looked at for the x86 ISA level (real files: 1-3)
# The dynamic tags read (the gABI's numbers; tests/binfmt checks them against pyelftools).
DT = {
    "NULL": 0, "NEEDED": 1, "STRTAB": 5, "STRSZ": 10, "SONAME": 14, "RPATH": 15,
    "RUNPATH": 29, "FLAGS_1": 0x6FFFFFFB, "VERDEF": 0x6FFFFFFC, "VERDEFNUM": 0x6FFFFFFD,
    "VERNEED": 0x6FFFFFFE, "VERNEEDNUM": 0x6FFFFFFF,
}  # fmt: skip
DF_1_PIE = 0x08000000
VER_FLG_WEAK = 0x2
SHT_ARM_ATTRIBUTES = 0x70000003
TAG_CPU_ARCH = 6


@dataclass(frozen=True)
class ElfLimits:
    """The budget of one parse. The largest real files use a small fraction of it.

    For scale: the host's libc.so.6 (1.9 MB) needs 28 KiB of reads, 45 version definitions
    and under 1 KiB of strings; big C++ programs need a few hundred libraries and versions.
    """

    max_read_bytes: int = 2 << 20  # everything read from the file
    max_dynamic_entries: int = 8192  # entries of PT_DYNAMIC scanned before DT_NULL
    max_needed: int = 1024  # distinct DT_NEEDED names
    max_search_dirs: int = 1024  # distinct DT_RPATH + DT_RUNPATH directories
    max_string_bytes: int = 4096  # one dynamic string (PATH_MAX)
    max_total_string_bytes: int = 256 << 10  # all distinct strings decoded
    max_version_records: int = 8192  # Verneed + Vernaux + Verdef records
    # Wall time, checked at every read. The caps above bound the work to milliseconds; this
    # is the backstop for a starved CPU or slow storage, so it is generous: a legitimate
    # file refused for time would read as corrupt.
    max_seconds: float = 2.0


DEFAULT_LIMITS = ElfLimits()


@dataclass(frozen=True)
class VersionRequirement:
    """One Vernaux entry: a version (e.g. GLIBC_2.34) needed from a library."""

    name: str
    weak: bool = False


@dataclass(frozen=True)
class VersionNeed:
    """One Verneed entry: the versions needed from the library with soname `file`."""

    file: str
    versions: tuple[VersionRequirement, ...]


@dataclass(frozen=True)
class ElfInfo:
    """The facts about an ELF file that decide whether, and with what, it can be executed."""

    machine: int
    elf_class: int
    little_endian: bool
    flags: int
    elf_type: int
    arch: str
    platform: Platform | None
    interpreter: str | None
    is_static: bool
    osabi: int = 0
    needed: tuple[str, ...] = ()
    rpath: tuple[str, ...] = ()
    runpath: tuple[str, ...] = ()
    soname: str | None = None
    version_needs: tuple[VersionNeed, ...] = ()
    version_defs: frozenset[str] = field(default_factory=frozenset)
    has_dynamic: bool = False
    is_pie: bool = False
    float_abi: str | None = None
    x86_isa_needed: int = 0  # GNU_PROPERTY_X86_ISA_1_NEEDED bits (binfmt.isa), x86 only

    @property
    def bits(self) -> int:
        return 64 if self.elf_class == machines.ELFCLASS64 else 32

    @property
    def is_executable(self) -> bool:
        """Something exec would start: ET_EXEC, a PIE, or a DSO that names a loader."""
        if self.elf_type == ET_EXEC:
            return True
        return self.elf_type == ET_DYN and (self.interpreter is not None or self.is_pie)

    def same_abi(self, other: ElfInfo) -> bool:
        """Whether ld.so would accept `other` as a dependency of this object."""
        return (self.machine, self.elf_class, self.little_endian) == (
            other.machine,
            other.elf_class,
            other.little_endian,
        )


class _Ehdr(NamedTuple):
    """The ELF header's fields this reader uses, after e_ident."""

    e_type: int
    e_machine: int
    e_phoff: int
    e_shoff: int
    e_flags: int
    e_phentsize: int
    e_phnum: int
    e_shentsize: int
    e_shnum: int


# e_type, e_machine, e_version, e_entry, e_phoff, e_shoff, e_flags, e_ehsize, e_phentsize,
# e_phnum, e_shentsize, e_shnum, e_shstrndx: 64 bytes in ELFCLASS64, 52 in ELFCLASS32.
_EHDR = {
    (little, bits): struct.Struct(("<" if little else ">") + "16xHHI" + word * 3 + "IHHHHHH")
    for little in (True, False)
    for bits, word in ((64, "Q"), (32, "I"))
}


def _ehdr(fields: tuple[int, ...]) -> _Ehdr:
    e_type, e_machine, _, _, phoff, shoff, flags, _, phentsize, phnum, shentsize, shnum, _ = fields
    return _Ehdr(e_type, e_machine, phoff, shoff, flags, phentsize, phnum, shentsize, shnum)


@dataclass(frozen=True)
class _Layout:
    """struct formats of the tables this reader walks, for one class and byte order."""

    order: str
    phdr: struct.Struct
    dyn: struct.Struct
    verneed: struct.Struct  # vn_version, vn_cnt, vn_file, vn_aux, vn_next
    vernaux: struct.Struct  # vna_hash, vna_flags, vna_other, vna_name, vna_next
    verdef: struct.Struct  # vd_version, vd_flags, vd_ndx, vd_cnt, vd_hash, vd_aux, vd_next
    verdaux: struct.Struct  # vda_name, vda_next

    @classmethod
    @functools.lru_cache(maxsize=4)
    def get(cls, little: bool, bits: int) -> _Layout:
        o = "<" if little else ">"
        phdr = "IIQQQQQQ" if bits == 64 else "IIIIIIII"
        return cls(
            o,
            struct.Struct(o + phdr),
            struct.Struct(o + ("qQ" if bits == 64 else "iI")),
            struct.Struct(o + "HHIII"),
            struct.Struct(o + "IHHII"),
            struct.Struct(o + "HHHHIII"),
            struct.Struct(o + "II"),
        )


class _Reader:
    """Bounded random access to one file, on the budget of one parse."""

    def __init__(self, f: BinaryIO, limits: ElfLimits) -> None:
        self.f = f
        self.limits = limits
        f.seek(0, os.SEEK_END)
        self.size = f.tell()
        self.read_bytes = 0
        self.deadline = time.monotonic() + limits.max_seconds

    def read(self, offset: int, length: int, what: str) -> bytes:
        if offset < 0 or length < 0 or offset + length > self.size:
            raise TruncatedFile(f"{what} outside the file")
        self.read_bytes += length
        if self.read_bytes > self.limits.max_read_bytes:
            raise ParseLimitExceeded(f"more than {self.limits.max_read_bytes} bytes of headers")
        if time.monotonic() > self.deadline:
            raise ParseLimitExceeded(f"parsing took more than {self.limits.max_seconds}s")
        self.f.seek(offset)
        data = self.f.read(length)
        if len(data) != length:
            raise TruncatedFile(f"{what} truncated")
        return data


@dataclass
class _Segment:
    kind: int
    offset: int
    vaddr: int
    filesz: int
    align: int = 0


class _StringTable:
    """The dynamic string table, read in small aligned windows as strings are asked for.

    Needed names and version names sit together near the end of .dynstr, so a few windows
    serve a whole file without reading the table (megabytes in big C++ libraries) at once.
    Each offset is decoded once: a thousand entries naming one string cost one string.
    """

    WINDOW = 1024

    def __init__(self, reader: _Reader, offset: int, size: int) -> None:
        self.reader = reader
        self.limits = reader.limits
        self.offset = offset
        self.declared = size
        self.size = min(size, reader.size - offset) if offset < reader.size else 0
        self.windows: dict[int, bytes] = {}
        self.strings: dict[int, str] = {}
        self.decoded = 0

    def _window(self, n: int) -> bytes:
        if n not in self.windows:
            start = n * self.WINDOW
            length = min(self.WINDOW, self.size - start)
            self.windows[n] = self.reader.read(self.offset + start, length, "dynamic string")
        return self.windows[n]

    def get(self, index: int) -> str:
        found = self.strings.get(index)
        if found is None:
            found = self.strings[index] = self._decode(index)
        return found

    def _decode(self, index: int) -> str:
        if 0 <= index < self.declared and index >= self.size:
            raise TruncatedFile("dynamic string outside the file")
        if index < 0 or index >= self.size:
            raise BinfmtError("string index outside the dynamic string table")
        window = self._window(index // self.WINDOW)
        start = index % self.WINDOW
        end = window.find(b"\0", start)
        if end >= 0:  # the usual case: the whole string in its first window
            return self._count(window[start:end])
        out = bytearray()
        pos = index
        while pos < self.size and len(out) < self.limits.max_string_bytes:
            window = self._window(pos // self.WINDOW)
            chunk = window[pos % self.WINDOW :]
            end = chunk.find(b"\0")
            if end >= 0:
                out += chunk[:end]
                return self._count(bytes(out))
            out += chunk
            pos += len(chunk)
        if len(out) >= self.limits.max_string_bytes:
            raise ParseLimitExceeded(
                f"a dynamic string longer than {self.limits.max_string_bytes} bytes"
            )
        raise BinfmtError("unterminated dynamic string")

    def _count(self, raw: bytes) -> str:
        self.decoded += len(raw) + 1
        if self.decoded > self.limits.max_total_string_bytes:
            raise ParseLimitExceeded(
                f"more than {self.limits.max_total_string_bytes} bytes of dynamic strings"
            )
        return raw.decode(*_FS_ENCODING)  # os.fsdecode, without its type checks


def read_elf(f: BinaryIO, limits: ElfLimits = DEFAULT_LIMITS) -> ElfInfo:
    """Parse the ELF file open in `f` (seekable, binary). Raises BinfmtError when malformed."""
    try:
        return _read(_Reader(f, limits))
    except (OverflowError, ValueError, struct.error) as exc:
        raise BinfmtError(f"malformed ELF ({exc})") from exc


def _read(reader: _Reader) -> ElfInfo:
    ident = reader.f.read(16) if reader.f.seek(0) == 0 else b""
    if len(ident) < 4 or ident[:4] != ELF_MAGIC:
        if len(ident) >= 4:
            raise BinfmtError("not an ELF file")
        raise TruncatedFile("truncated ELF header")
    if len(ident) < 16:
        raise TruncatedFile("truncated ELF header")
    elf_class, data = ident[4], ident[5]
    if elf_class not in (machines.ELFCLASS32, machines.ELFCLASS64):
        raise BinfmtError(f"invalid ELF class {elf_class}")
    if data not in (1, 2):
        raise BinfmtError(f"invalid ELF data encoding {data}")
    little = data == 1
    bits = 32 if elf_class == machines.ELFCLASS32 else 64
    ehdr_struct = _EHDR[little, bits]
    if reader.size < ehdr_struct.size:
        raise TruncatedFile("truncated ELF header")
    ehdr = _ehdr(ehdr_struct.unpack(reader.read(0, ehdr_struct.size, "ELF header")))
    machine, elf_type, flags = ehdr.e_machine, ehdr.e_type, ehdr.e_flags
    layout = _Layout.get(little, bits)

    segments = _program_headers(reader, layout, ehdr)
    interpreter = _interpreter(reader, segments)
    dyn = _Dynamic.read(reader, layout, segments)

    arch = machines.classify(machine, elf_class, little, flags)
    platform: Platform | None = None
    float_abi = None
    isa_needed = 0
    if machine in (machines.EM_X86_64, machines.EM_386):
        isa_needed = _x86_isa_needed(reader, segments, little, bits)
    if arch.oci is not None:
        os_name = machines.os_from_osabi(ident[7])
        if os_name == "linux":
            os_name = _abi_note_os(reader, segments, little) or os_name
        variant = None
        if machine == machines.EM_ARM:
            float_abi = machines.arm_float_abi(flags)
            cpu_arch = _arm_cpu_arch(reader, ehdr, little, bits)
            variant = None if cpu_arch is None else machines.arm_variant_from_cpu_arch(cpu_arch)
        platform = Platform(os_name, arch.oci, variant)
    return ElfInfo(
        machine=machine,
        elf_class=elf_class,
        little_endian=little,
        flags=flags,
        elf_type=elf_type,
        arch=arch.label,
        platform=platform,
        interpreter=interpreter,
        is_static=interpreter is None and not dyn.needed,
        osabi=ident[7],
        needed=dyn.needed,
        rpath=dyn.rpath,
        runpath=dyn.runpath,
        soname=dyn.soname,
        version_needs=dyn.version_needs,
        version_defs=dyn.version_defs,
        has_dynamic=dyn.present,
        is_pie=dyn.pie,
        float_abi=float_abi,
        x86_isa_needed=isa_needed,
    )


def _program_headers(reader: _Reader, layout: _Layout, ehdr: _Ehdr) -> list[_Segment]:
    count = ehdr.e_phnum
    if count == 0:
        return []
    entry = layout.phdr.size
    if ehdr.e_phentsize != entry:
        raise BinfmtError(f"program header entry size {ehdr.e_phentsize}, expected {entry}")
    if count * entry > MAX_PHDR_BYTES:
        raise ParseLimitExceeded("program header table too large")
    table = reader.read(ehdr.e_phoff, count * entry, "program header table")
    segments = []
    for fields in layout.phdr.iter_unpack(table):
        kind = fields[0]
        if kind in (PT_LOAD, PT_DYNAMIC, PT_INTERP, PT_NOTE):
            # Elf64_Phdr: type, flags, offset, vaddr, paddr, filesz, memsz, align; Elf32
            # puts flags after memsz.
            offset, vaddr, filesz = (
                fields[2:4] + fields[5:6] if entry == 56 else fields[1:3] + fields[4:5]
            )
            segments.append(_Segment(kind, offset, vaddr, filesz, fields[7]))
    return segments


def _interpreter(reader: _Reader, segments: list[_Segment]) -> str | None:
    for seg in segments:
        if seg.kind == PT_INTERP:
            if not 2 <= seg.filesz <= MAX_INTERP_BYTES:
                raise BinfmtError(f"PT_INTERP of {seg.filesz} bytes")
            raw = reader.read(seg.offset, seg.filesz, "PT_INTERP")
            if raw[-1] != 0:
                raise BinfmtError("PT_INTERP is not NUL-terminated")
            # The kernel uses the string up to the first NUL, like any C string.
            return os.fsdecode(raw.split(b"\0", 1)[0])
    return None


def _x86_isa_needed(reader: _Reader, segments: list[_Segment], little: bool, bits: int) -> int:
    """GNU_PROPERTY_X86_ISA_1_NEEDED as glibc's x86 ld.so finds it: in the PT_NOTE segments
    aligned to the class's word, last first, the first holding a GNU property note. The
    note is optional: one that cannot be read needs nothing, as it does for ld.so."""
    notes = [s for s in segments if s.kind == PT_NOTE and s.align == bits // 8]
    for seg in reversed(notes[-MAX_NOTE_SEGMENTS:]):
        length = min(seg.filesz, isa.MAX_NOTE_BYTES, max(reader.size - seg.offset, 0))
        try:
            found = isa.parse_isa_needed(reader.read(seg.offset, length, "PT_NOTE"), little, bits)
        except TruncatedFile:
            return 0
        if found is not None:
            return found
    return 0


def _abi_note_os(reader: _Reader, segments: list[_Segment], little: bool) -> str | None:
    """The OS an ABI tag note names (OpenBSD and NetBSD mark their ELF files with one and
    OS/ABI 0), in the first MAX_NOTE_SEGMENTS PT_NOTE segments, MAX_NOTE_BYTES of each."""
    for seg in [s for s in segments if s.kind == PT_NOTE][:MAX_NOTE_SEGMENTS]:
        length = min(seg.filesz, isa.MAX_NOTE_BYTES, max(reader.size - seg.offset, 0))
        try:
            found = machines.abi_note_os(reader.read(seg.offset, length, "PT_NOTE"), little)
        except TruncatedFile:
            return None
        if found is not None:
            return found
    return None


def _file_offset(segments: list[_Segment], vaddr: int) -> int:
    """Translate a virtual address from the dynamic section through the PT_LOAD mapping."""
    for seg in segments:
        if seg.kind == PT_LOAD and seg.vaddr <= vaddr < seg.vaddr + seg.filesz:
            return seg.offset + (vaddr - seg.vaddr)
    raise BinfmtError(f"address {vaddr:#x} is not in any PT_LOAD segment")


_STRING_TAGS = (DT["NEEDED"], DT["RPATH"], DT["RUNPATH"], DT["SONAME"])
_WANTED_TAGS = frozenset(
    DT[t] for t in ("STRTAB", "STRSZ", "FLAGS_1", "VERNEED", "VERNEEDNUM", "VERDEF", "VERDEFNUM")
) | frozenset(_STRING_TAGS)


@dataclass
class _Dynamic:
    present: bool = False
    needed: tuple[str, ...] = ()
    rpath: tuple[str, ...] = ()
    runpath: tuple[str, ...] = ()
    soname: str | None = None
    pie: bool = False
    version_needs: tuple[VersionNeed, ...] = ()
    version_defs: frozenset[str] = frozenset()

    @classmethod
    def read(cls, reader: _Reader, layout: _Layout, segments: list[_Segment]) -> _Dynamic:
        seg = next((s for s in segments if s.kind == PT_DYNAMIC), None)
        if seg is None:
            return cls()
        limits = reader.limits
        entry = layout.dyn.size
        # ld.so stops at DT_NULL, not at p_filesz; a lying p_filesz is clamped to the file.
        present = min(seg.filesz, max(reader.size - seg.offset, 0)) // entry
        count = min(present, limits.max_dynamic_entries)
        raw = reader.read(seg.offset, count * entry, "dynamic segment")
        # Values of one tag in file order, each value once: 8192 DT_NEEDED entries naming
        # the same string are one library, as they are to ld.so.
        tags: dict[int, dict[int, None]] = {}
        for tag, value in layout.dyn.iter_unpack(raw):
            if tag == DT["NULL"]:
                break
            if tag in _WANTED_TAGS:
                tags.setdefault(tag, {})[value] = None
        else:
            if present > count:  # ld.so would read on: what follows is unknown, not absent
                raise ParseLimitExceeded(f"more than {count} dynamic entries before DT_NULL")

        def first(tag: str) -> int | None:
            values = tags.get(DT[tag])
            return next(iter(values)) if values else None

        def all_of(tag: str) -> list[int]:
            return list(tags.get(DT[tag], ()))

        result = cls(present=True, pie=bool((first("FLAGS_1") or 0) & DF_1_PIE))
        strtab_addr = first("STRTAB")
        if strtab_addr is None:
            if any(t in tags for t in _STRING_TAGS):
                raise BinfmtError("dynamic section has strings but no DT_STRTAB")
            return result
        strings = _StringTable(
            reader, _file_offset(segments, strtab_addr), first("STRSZ") or reader.size
        )
        result.needed = _distinct(
            (strings.get(i) for i in all_of("NEEDED")), limits.max_needed, "DT_NEEDED libraries"
        )
        result.rpath = _search_path(strings, all_of("RPATH"), limits)
        result.runpath = _search_path(strings, all_of("RUNPATH"), limits)
        soname = first("SONAME")
        result.soname = None if soname is None else strings.get(soname)
        budget = _Budget(limits.max_version_records)
        verneed = first("VERNEED")
        if verneed is not None:
            result.version_needs = _version_needs(
                reader, layout, strings, _file_offset(segments, verneed),
                first("VERNEEDNUM") or 0, budget,
            )  # fmt: skip
        verdef = first("VERDEF")
        if verdef is not None:
            result.version_defs = _version_defs(
                reader, layout, strings, _file_offset(segments, verdef),
                first("VERDEFNUM") or 0, budget,
            )  # fmt: skip
        return result


def _distinct(items: Iterable[str], limit: int, what: str) -> tuple[str, ...]:
    """Items in first-seen order, each once; more than `limit` distinct ones is hostile."""
    out: dict[str, None] = {}
    for item in items:
        out[item] = None
        if len(out) > limit:
            raise ParseLimitExceeded(f"more than {limit} {what}")
    return tuple(out)


def _search_path(strings: _StringTable, indexes: list[int], limits: ElfLimits) -> tuple[str, ...]:
    """DT_RPATH/DT_RUNPATH directories; a repeated directory adds no candidate to ld.so."""
    dirs = (d for i in indexes for d in strings.get(i).split(":") if d)
    return _distinct(dirs, limits.max_search_dirs, "search path directories")


class _Records:
    """Version records read through one window at the start of their table: real tables
    are a few hundred contiguous bytes (one read instead of one per record). A record
    outside the window, as a hostile chain may point, is read on its own."""

    WINDOW = 2048

    def __init__(self, reader: _Reader, offset: int) -> None:
        self.reader, self.start = reader, offset
        length = min(self.WINDOW, reader.size - offset) if 0 <= offset < reader.size else 0
        self.data = reader.read(offset, length, "version records") if length > 0 else b""

    def unpack(self, record: struct.Struct, offset: int, what: str) -> tuple[int, ...]:
        at = offset - self.start
        if at >= 0 and at + record.size <= len(self.data):
            return record.unpack_from(self.data, at)
        return record.unpack(self.reader.read(offset, record.size, what))


class _Budget:
    """Version records left to read, shared by Verneed and Verdef walks (which may loop)."""

    def __init__(self, records: int) -> None:
        self.left = records
        self.limit = records

    def spend(self) -> None:
        self.left -= 1
        if self.left < 0:
            raise ParseLimitExceeded(f"more than {self.limit} symbol version records")


def _version_needs(
    reader: _Reader,
    layout: _Layout,
    strings: _StringTable,
    offset: int,
    count: int,
    budget: _Budget,
) -> tuple[VersionNeed, ...]:
    needs = []
    records = _Records(reader, offset)
    for _ in range(count):
        budget.spend()
        _, vn_cnt, vn_file, vn_aux, vn_next = records.unpack(layout.verneed, offset, "version need")
        versions = []
        aux = offset + vn_aux
        for _ in range(vn_cnt):
            budget.spend()
            _, vna_flags, _, vna_name, vna_next = records.unpack(
                layout.vernaux, aux, "version need aux"
            )
            versions.append(
                VersionRequirement(strings.get(vna_name), bool(vna_flags & VER_FLG_WEAK))
            )
            if vna_next == 0:
                break
            aux += vna_next
        needs.append(VersionNeed(strings.get(vn_file), tuple(versions)))
        if vn_next == 0:
            break
        offset += vn_next
    return tuple(needs)


def _version_defs(
    reader: _Reader,
    layout: _Layout,
    strings: _StringTable,
    offset: int,
    count: int,
    budget: _Budget,
) -> frozenset[str]:
    names = set()
    records = _Records(reader, offset)
    for _ in range(count):
        budget.spend()
        _, _, _, vd_cnt, _, vd_aux, vd_next = records.unpack(
            layout.verdef, offset, "version definition"
        )
        if vd_cnt > 0:
            name = records.unpack(layout.verdaux, offset + vd_aux, "version def aux")[0]
            names.add(strings.get(name))
        if vd_next == 0:
            break
        offset += vd_next
    return frozenset(names)


def _arm_cpu_arch(reader: _Reader, ehdr: _Ehdr, little: bool, bits: int) -> int | None:
    """Tag_CPU_arch from `.ARM.attributes`, or None when absent or unreadable.

    The attributes are optional (Go omits them), so a damaged section only loses the variant.
    Only sh_type, sh_offset and sh_size of each section header are looked at.
    """
    count, entry = ehdr.e_shnum, ehdr.e_shentsize
    shdr = struct.Struct(("<" if little else ">") + ("4xI16xQQ" if bits == 64 else "4xI8xII"))
    if (
        count == 0
        or entry != (64 if bits == 64 else 40)
        or count * entry > MAX_SECTION_HEADERS_BYTES
    ):
        return None
    try:
        table = reader.read(ehdr.e_shoff, count * entry, "section header table")
        for i in range(count):
            kind, offset, size = shdr.unpack_from(table, i * entry)
            if kind == SHT_ARM_ATTRIBUTES:
                size = min(size, MAX_ARM_ATTRIBUTES_BYTES)
                return parse_arm_cpu_arch(reader.read(offset, size, ".ARM.attributes"), little)
    except (BinfmtError, ValueError):  # TruncatedFile, a bad ULEB128: no variant
        return None
    return None


def _uleb128(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise BinfmtError("bad ULEB128")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def parse_arm_cpu_arch(data: bytes, little: bool) -> int | None:
    """Find Tag_CPU_arch in the file-scope "aeabi" attributes (ARM IHI 0045, section 2.2)."""
    order: Any = "little" if little else "big"
    if not data or data[0] != ord("A"):
        return None
    pos = 1
    while pos + 4 <= len(data):
        length = int.from_bytes(data[pos : pos + 4], order)
        end = min(pos + length, len(data))
        if length < 4:
            return None
        name_end = data.find(b"\0", pos + 4, end)
        if name_end >= 0 and data[pos + 4 : name_end] == b"aeabi":
            sub = name_end + 1
            while sub + 5 <= end:
                tag, body = _uleb128(data, sub)
                size = int.from_bytes(data[body : body + 4], order)
                if size < 5:
                    return None
                if tag == 1:  # Tag_File: attributes apply to the whole file
                    found = _find_cpu_arch(data[body + 4 : min(sub + size, end)])
                    if found is not None:
                        return found
                sub += size
        pos += length
    return None


def _find_cpu_arch(attrs: bytes) -> int | None:
    pos = 0
    while pos < len(attrs):
        tag, pos = _uleb128(attrs, pos)
        if tag == TAG_CPU_ARCH:
            return _uleb128(attrs, pos)[0]
        if tag == 32:  # Tag_compatibility: ULEB flag, then a string
            _, pos = _uleb128(attrs, pos)
            pos = attrs.index(b"\0", pos) + 1
        elif tag in (4, 5, 67) or (tag > 32 and tag % 2 == 1):  # NTBS-valued tags
            pos = attrs.index(b"\0", pos) + 1
        else:
            _, pos = _uleb128(attrs, pos)
    return None
