"""Read what exec and the dynamic loader look at in an ELF file, and nothing more.

The reader uses pyelftools' struct definitions but drives them itself: it reads the ELF
header, the program header table, PT_INTERP, PT_DYNAMIC and the dynamic string and
version tables through the PT_LOAD mapping, as ld.so does. It never loads whole sections
of unknown size, so a 2 GB file costs a few reads, and every size and count taken from the
file is checked against the file size and a fixed cap before it is used: hostile headers
give a BinfmtError, never a huge allocation, a hang or another exception.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from elftools.construct import ConstructError
from elftools.elf.enums import ENUM_E_MACHINE, ENUM_E_TYPE
from elftools.elf.structs import ELFStructs

from execwatch.binfmt import machines
from execwatch.binfmt.errors import BinfmtError
from execwatch.binfmt.platform import Platform

ELF_MAGIC = b"\x7fELF"
ET_EXEC = 2
ET_DYN = 3

MAX_PHDR_BYTES = 65536  # fs/binfmt_elf.c refuses larger program header tables
MAX_INTERP_BYTES = 4096  # PATH_MAX, the kernel's limit for PT_INTERP
MAX_DYNAMIC_ENTRIES = 8192
MAX_STRING_BYTES = 4096
MAX_VERSION_RECORDS = 8192
MAX_ARM_ATTRIBUTES_BYTES = 65536
MAX_SECTION_HEADERS_BYTES = 1 << 22

DF_1_PIE = 0x08000000
VER_FLG_BASE = 0x1
VER_FLG_WEAK = 0x2
SHT_ARM_ATTRIBUTES = 0x70000003
TAG_CPU_ARCH = 6


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


@functools.lru_cache(maxsize=32)
def _structs(little_endian: bool, elf_class: int, machine: str | None) -> ELFStructs:
    """pyelftools builds its construct definitions per file; build them once per ABI."""
    structs = ELFStructs(little_endian=little_endian, elfclass=elf_class)
    structs.create_basic_structs()
    structs.create_advanced_structs(None, machine, None)
    return structs


def _number(value: Any, table: Mapping[str, int]) -> int:
    """pyelftools turns known enum values into names; get the number back."""
    return value if isinstance(value, int) else table[value]


class _Reader:
    """Bounded random access to one file."""

    def __init__(self, f: BinaryIO) -> None:
        self.f = f
        f.seek(0, os.SEEK_END)
        self.size = f.tell()

    def read(self, offset: int, length: int, what: str) -> bytes:
        if offset < 0 or length < 0 or offset + length > self.size:
            raise BinfmtError(f"{what} outside the file")
        self.f.seek(offset)
        data = self.f.read(length)
        if len(data) != length:
            raise BinfmtError(f"{what} truncated")
        return data


@dataclass
class _Segment:
    kind: Any
    offset: int
    vaddr: int
    filesz: int


class _StringTable:
    """The dynamic string table, read in small aligned windows as strings are asked for.

    Needed names and version names sit together near the end of .dynstr, so a few windows
    serve a whole file without reading the table (megabytes in big C++ libraries) at once.
    """

    WINDOW = 1024

    def __init__(self, reader: _Reader, offset: int, size: int) -> None:
        self.reader = reader
        self.offset = offset
        self.size = min(size, reader.size - offset) if offset < reader.size else 0
        self.windows: dict[int, bytes] = {}

    def _window(self, n: int) -> bytes:
        if n not in self.windows:
            start = n * self.WINDOW
            length = min(self.WINDOW, self.size - start)
            self.windows[n] = self.reader.read(self.offset + start, length, "dynamic string")
        return self.windows[n]

    def get(self, index: int) -> str:
        if index < 0 or index >= self.size:
            raise BinfmtError("string index outside the dynamic string table")
        out = bytearray()
        pos = index
        while pos < self.size and len(out) < MAX_STRING_BYTES:
            window = self._window(pos // self.WINDOW)
            chunk = window[pos % self.WINDOW :]
            end = chunk.find(b"\0")
            if end >= 0:
                out += chunk[:end]
                return os.fsdecode(bytes(out))
            out += chunk
            pos += len(chunk)
        raise BinfmtError("unterminated dynamic string")


def read_elf(f: BinaryIO) -> ElfInfo:
    """Parse the ELF file open in `f` (seekable, binary). Raises BinfmtError when malformed."""
    try:
        return _read(_Reader(f))
    except ConstructError as exc:
        raise BinfmtError(f"malformed ELF structure ({type(exc).__name__})") from exc
    except (OverflowError, ValueError) as exc:
        raise BinfmtError(f"malformed ELF ({exc})") from exc


def _read(reader: _Reader) -> ElfInfo:
    ident = reader.f.read(16) if reader.f.seek(0) == 0 else b""
    if len(ident) < 4 or ident[:4] != ELF_MAGIC:
        raise BinfmtError("not an ELF file" if len(ident) >= 4 else "truncated ELF header")
    if len(ident) < 16:
        raise BinfmtError("truncated ELF header")
    elf_class, data = ident[4], ident[5]
    if elf_class not in (machines.ELFCLASS32, machines.ELFCLASS64):
        raise BinfmtError(f"invalid ELF class {elf_class}")
    if data not in (1, 2):
        raise BinfmtError(f"invalid ELF data encoding {data}")
    little = data == 1
    bits = 32 if elf_class == machines.ELFCLASS32 else 64
    base = _structs(little, bits, None)
    ehdr_size = base.Elf_Ehdr.sizeof()
    if reader.size < ehdr_size:
        raise BinfmtError("truncated ELF header")
    ehdr = base.Elf_Ehdr.parse(reader.read(0, ehdr_size, "ELF header"))
    machine = _number(ehdr["e_machine"], ENUM_E_MACHINE)
    elf_type = _number(ehdr["e_type"], ENUM_E_TYPE)
    flags = int(ehdr["e_flags"])
    machine_name = "EM_ARM" if machine == machines.EM_ARM else None
    structs = _structs(little, bits, machine_name)

    segments = _program_headers(reader, structs, ehdr)
    interpreter = _interpreter(reader, segments)
    dyn = _Dynamic.read(reader, structs, segments)

    arch = machines.classify(machine, elf_class, little, flags)
    platform: Platform | None = None
    float_abi = None
    if arch.oci is not None:
        os_name = machines.os_from_osabi(ident[7])
        variant = None
        if machine == machines.EM_ARM:
            float_abi = machines.arm_float_abi(flags)
            cpu_arch = _arm_cpu_arch(reader, structs, ehdr, little)
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
    )


def _program_headers(reader: _Reader, structs: ELFStructs, ehdr: Any) -> list[_Segment]:
    count = int(ehdr["e_phnum"])
    if count == 0:
        return []
    entry = structs.Elf_Phdr.sizeof()
    if int(ehdr["e_phentsize"]) != entry:
        raise BinfmtError(f"program header entry size {ehdr['e_phentsize']}, expected {entry}")
    if count * entry > MAX_PHDR_BYTES:
        raise BinfmtError("program header table too large")
    table = reader.read(int(ehdr["e_phoff"]), count * entry, "program header table")
    segments = []
    for i in range(count):
        phdr = structs.Elf_Phdr.parse(table[i * entry : (i + 1) * entry])
        segments.append(
            _Segment(phdr["p_type"], phdr["p_offset"], phdr["p_vaddr"], phdr["p_filesz"])
        )
    return segments


def _interpreter(reader: _Reader, segments: list[_Segment]) -> str | None:
    for seg in segments:
        if seg.kind == "PT_INTERP":
            if not 2 <= seg.filesz <= MAX_INTERP_BYTES:
                raise BinfmtError(f"PT_INTERP of {seg.filesz} bytes")
            raw = reader.read(seg.offset, seg.filesz, "PT_INTERP")
            if raw[-1] != 0:
                raise BinfmtError("PT_INTERP is not NUL-terminated")
            # The kernel uses the string up to the first NUL, like any C string.
            return os.fsdecode(raw.split(b"\0", 1)[0])
    return None


def _file_offset(segments: list[_Segment], vaddr: int) -> int:
    """Translate a virtual address from the dynamic section through the PT_LOAD mapping."""
    for seg in segments:
        if seg.kind == "PT_LOAD" and seg.vaddr <= vaddr < seg.vaddr + seg.filesz:
            return seg.offset + (vaddr - seg.vaddr)
    raise BinfmtError(f"address {vaddr:#x} is not in any PT_LOAD segment")


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
    def read(cls, reader: _Reader, structs: ELFStructs, segments: list[_Segment]) -> _Dynamic:
        seg = next((s for s in segments if s.kind == "PT_DYNAMIC"), None)
        if seg is None:
            return cls()
        entry = structs.Elf_Dyn.sizeof()
        # ld.so stops at DT_NULL, not at p_filesz; a lying p_filesz is clamped to the file.
        count = min(seg.filesz, max(reader.size - seg.offset, 0)) // entry
        count = min(count, MAX_DYNAMIC_ENTRIES)
        raw = reader.read(seg.offset, count * entry, "dynamic segment")
        tags: dict[str, list[int]] = {}
        for i in range(count):
            dyn = structs.Elf_Dyn.parse(raw[i * entry : (i + 1) * entry])
            if dyn["d_tag"] == "DT_NULL":
                break
            if isinstance(dyn["d_tag"], str):
                tags.setdefault(dyn["d_tag"], []).append(int(dyn["d_val"]))

        def first(tag: str) -> int | None:
            values = tags.get(tag)
            return values[0] if values else None

        result = cls(present=True, pie=bool((first("DT_FLAGS_1") or 0) & DF_1_PIE))
        strtab_addr = first("DT_STRTAB")
        string_tags = ("DT_NEEDED", "DT_RPATH", "DT_RUNPATH", "DT_SONAME")
        if strtab_addr is None:
            if any(t in tags for t in string_tags):
                raise BinfmtError("dynamic section has strings but no DT_STRTAB")
            return result
        strings = _StringTable(
            reader, _file_offset(segments, strtab_addr), first("DT_STRSZ") or reader.size
        )
        result.needed = tuple(strings.get(i) for i in tags.get("DT_NEEDED", []))
        result.rpath = _search_path(strings, tags.get("DT_RPATH", []))
        result.runpath = _search_path(strings, tags.get("DT_RUNPATH", []))
        soname = first("DT_SONAME")
        result.soname = None if soname is None else strings.get(soname)
        budget = [MAX_VERSION_RECORDS]
        verneed = first("DT_VERNEED")
        if verneed is not None:
            result.version_needs = _version_needs(
                reader, structs, strings, _file_offset(segments, verneed),
                first("DT_VERNEEDNUM") or 0, budget,
            )  # fmt: skip
        verdef = first("DT_VERDEF")
        if verdef is not None:
            result.version_defs = _version_defs(
                reader, structs, strings, _file_offset(segments, verdef),
                first("DT_VERDEFNUM") or 0, budget,
            )  # fmt: skip
        return result


def _search_path(strings: _StringTable, indexes: list[int]) -> tuple[str, ...]:
    return tuple(d for i in indexes for d in strings.get(i).split(":") if d)


def _spend(budget: list[int]) -> None:
    budget[0] -= 1
    if budget[0] < 0:
        raise BinfmtError("too many symbol version records")


def _version_needs(
    reader: _Reader,
    structs: ELFStructs,
    strings: _StringTable,
    offset: int,
    count: int,
    budget: list[int],
) -> tuple[VersionNeed, ...]:
    needs = []
    need_size, aux_size = structs.Elf_Verneed.sizeof(), structs.Elf_Vernaux.sizeof()
    for _ in range(count):
        _spend(budget)
        vn = structs.Elf_Verneed.parse(reader.read(offset, need_size, "version need"))
        versions = []
        aux = offset + vn["vn_aux"]
        for _ in range(vn["vn_cnt"]):
            _spend(budget)
            vna = structs.Elf_Vernaux.parse(reader.read(aux, aux_size, "version need aux"))
            weak = bool(vna["vna_flags"] & VER_FLG_WEAK)
            versions.append(VersionRequirement(strings.get(vna["vna_name"]), weak))
            if vna["vna_next"] == 0:
                break
            aux += vna["vna_next"]
        needs.append(VersionNeed(strings.get(vn["vn_file"]), tuple(versions)))
        if vn["vn_next"] == 0:
            break
        offset += vn["vn_next"]
    return tuple(needs)


def _version_defs(
    reader: _Reader,
    structs: ELFStructs,
    strings: _StringTable,
    offset: int,
    count: int,
    budget: list[int],
) -> frozenset[str]:
    names = set()
    def_size, aux_size = structs.Elf_Verdef.sizeof(), structs.Elf_Verdaux.sizeof()
    for _ in range(count):
        _spend(budget)
        vd = structs.Elf_Verdef.parse(reader.read(offset, def_size, "version definition"))
        if vd["vd_cnt"] > 0:
            aux = offset + vd["vd_aux"]
            vda = structs.Elf_Verdaux.parse(reader.read(aux, aux_size, "version def aux"))
            names.add(strings.get(vda["vda_name"]))
        if vd["vd_next"] == 0:
            break
        offset += vd["vd_next"]
    return frozenset(names)


def _arm_cpu_arch(reader: _Reader, structs: ELFStructs, ehdr: Any, little: bool) -> int | None:
    """Tag_CPU_arch from `.ARM.attributes`, or None when absent or unreadable.

    The attributes are optional (Go omits them), so a damaged section only loses the variant.
    """
    count, entry = int(ehdr["e_shnum"]), structs.Elf_Shdr.sizeof()
    if count == 0 or int(ehdr["e_shentsize"]) != entry or count * entry > MAX_SECTION_HEADERS_BYTES:
        return None
    try:
        table = reader.read(int(ehdr["e_shoff"]), count * entry, "section header table")
        for i in range(count):
            shdr = structs.Elf_Shdr.parse(table[i * entry : (i + 1) * entry])
            kind = shdr["sh_type"]
            if kind == "SHT_ARM_ATTRIBUTES" or kind == SHT_ARM_ATTRIBUTES:
                size = min(int(shdr["sh_size"]), MAX_ARM_ATTRIBUTES_BYTES)
                data = reader.read(int(shdr["sh_offset"]), size, ".ARM.attributes")
                return parse_arm_cpu_arch(data, little)
    except (BinfmtError, ValueError):
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
