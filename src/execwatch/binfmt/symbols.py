"""Dynamic symbols: what an ELF object imports (with the version it asks for) and exports.

Read from the section headers' .dynsym, its string table and the GNU version sections,
all bounded (MAX_TABLE_BYTES per table, MAX_SYMBOLS symbols, MAX_IMPORTS imports,
MAX_NAME_BYTES of distinct names, MAX_VERSION_ENTRIES versions). An object without section
headers, or over a bound, gives None: unknown, never "nothing missing". Only read on
demand (one executable and what it loads), never for every file of an image: libLLVM's
89,000 exports take 250 ms in Python.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

from execwatch.binfmt.elf import ElfInfo

SHT_DYNSYM = 11
SHT_GNU_VERDEF = 0x6FFFFFFD
SHT_GNU_VERNEED = 0x6FFFFFFE
SHT_GNU_VERSYM = 0x6FFFFFFF
STB_GLOBAL, STB_WEAK, STB_GNU_UNIQUE = 1, 2, 10
MAX_TABLE_BYTES = 16 << 20
MAX_SYMBOLS = 1 << 18  # libLLVM exports 89,000; more is treated as unknown
MAX_IMPORTS = 1 << 15  # undefined symbols kept; python3.11 imports 511, libLLVM 524
MAX_NAME_BYTES = 6 << 20  # distinct names decoded, each once; libLLVM's are 3 MiB
MAX_SECTIONS = 1 << 16
MAX_VERSION_ENTRIES = 1 << 14
MAX_OFFSET = 1 << 62  # beyond any file; a larger one would not even fit a seek (ssize_t)


@dataclass(frozen=True, slots=True)
class SymbolRef:
    name: str
    version: str | None  # GLIBC_2.38, CURL_OPENSSL_4
    library: str | None  # the DT_NEEDED name the version is required from


@dataclass(frozen=True, slots=True)
class DynamicSymbols:
    imports: tuple[SymbolRef, ...]  # undefined, not weak
    exports: frozenset[str]  # "name" and "name@version" of every defined global symbol

    def defines(self, ref: SymbolRef) -> bool:
        if ref.version is not None:
            return f"{ref.name}@{ref.version}" in self.exports
        return ref.name in self.exports


class _File:
    def __init__(self, f: BinaryIO, info: ElfInfo) -> None:
        self.f = f
        self.e = "<" if info.little_endian else ">"
        self.wide = info.bits == 64

    def read(self, offset: int, size: int) -> bytes | None:
        if not 0 <= offset <= MAX_OFFSET or size < 0 or size > MAX_TABLE_BYTES:
            return None
        self.f.seek(offset)
        data = self.f.read(size)
        return data if len(data) == size else None


def read_dynamic_symbols(f: BinaryIO, info: ElfInfo) -> DynamicSymbols | None:
    r = _File(f, info)
    sections = _sections(r)
    if sections is None:
        return None
    by_type = {s[0]: s for s in reversed(sections)}
    dynsym = by_type.get(SHT_DYNSYM)
    if dynsym is None:
        return DynamicSymbols((), frozenset())
    _, offset, size, link, entsize = dynsym
    if link >= len(sections) or not entsize or size // entsize > MAX_SYMBOLS:
        return None
    strtab = r.read(sections[link][1], sections[link][2])
    table = r.read(offset, size)
    if strtab is None or table is None:
        return None
    versym = _versym(r, by_type.get(SHT_GNU_VERSYM))
    defs = _verdefs(r, by_type.get(SHT_GNU_VERDEF), strtab)
    needs = _verneeds(r, by_type.get(SHT_GNU_VERNEED), strtab)
    imports: list[SymbolRef] = []
    exports: set[str] = set()
    names = _Names(strtab)
    for i, (name_off, bind, shndx) in enumerate(_symbols(r, table, entsize)):
        if bind not in (STB_GLOBAL, STB_WEAK, STB_GNU_UNIQUE):
            continue
        name = names.get(name_off)
        if name is None or len(imports) > MAX_IMPORTS:
            return None  # over a bound: unknown
        if not name:
            continue
        ver = versym[i] & 0x7FFF if i < len(versym) else 0
        if shndx == 0:
            if bind != STB_WEAK:
                version, library = needs.get(ver, (None, None))
                imports.append(SymbolRef(name, version, library))
            continue
        exports.add(name)
        if ver in defs:
            exports.add(f"{name}@{defs[ver]}")
    return DynamicSymbols(tuple(imports), frozenset(exports))


def _sections(r: _File) -> list[tuple[int, int, int, int, int]] | None:
    """(type, offset, size, link, entsize) of each section header."""
    head = r.read(0, 64)
    if head is None:
        return None
    if r.wide:
        shoff, shentsize, shnum = (
            struct.unpack_from(r.e + "Q", head, 0x28)[0],
            *struct.unpack_from(r.e + "HH", head, 0x3A),
        )
        fmt, want = r.e + "IIQQQQIIQQ", 64
    else:
        shoff, shentsize, shnum = (
            struct.unpack_from(r.e + "I", head, 0x20)[0],
            *struct.unpack_from(r.e + "HH", head, 0x2E),
        )
        fmt, want = r.e + "IIIIIIIIII", 40
    if not shoff or shentsize < want or not 0 < shnum <= MAX_SECTIONS:
        return None
    raw = r.read(shoff, shentsize * shnum)
    if raw is None:
        return None
    out = []
    for i in range(shnum):
        _, kind, _, _, offset, size, link, _, _, entsize = struct.unpack_from(
            fmt, raw, i * shentsize
        )
        out.append((kind, offset, size, link, entsize))
    return out


class _Names:
    """Symbol names, each offset decoded once: 262,000 symbols naming suffixes of one long
    string would otherwise hold a copy each (a 6 MB file, 560 MB). None past MAX_NAME_BYTES."""

    def __init__(self, strtab: bytes) -> None:
        self.strtab = strtab
        self.cache: dict[int, str] = {}
        self.decoded = 0

    def get(self, offset: int) -> str | None:
        name = self.cache.get(offset)
        if name is None:
            name = self.cache[offset] = _string(self.strtab, offset)
            self.decoded += len(name)
            if self.decoded > MAX_NAME_BYTES:
                return None
        return name


def _symbols(r: _File, table: bytes, entsize: int) -> Iterator[tuple[int, int, int]]:
    """(name offset, binding, section index) of each symbol."""
    if r.wide:
        fmt, size, name_at, info_at, shndx_at = r.e + "IBBHQQ", 24, 0, 1, 3
    else:
        fmt, size, name_at, info_at, shndx_at = r.e + "IIIBBH", 16, 0, 3, 5
    if entsize < size:
        return
    for off in range(0, len(table) - size + 1, entsize):
        fields = struct.unpack_from(fmt, table, off)
        yield fields[name_at], fields[info_at] >> 4, fields[shndx_at]


def _string(strtab: bytes, offset: int) -> str:
    end = strtab.find(b"\0", offset)
    return strtab[offset:end].decode(errors="replace") if 0 <= offset < end else ""


def _versym(r: _File, section: tuple[int, int, int, int, int] | None) -> tuple[int, ...]:
    if section is None:
        return ()
    data = r.read(section[1], section[2] & ~1)
    return struct.unpack(f"{r.e}{len(data) // 2}H", data) if data else ()


def _verdefs(
    r: _File, section: tuple[int, int, int, int, int] | None, strtab: bytes
) -> dict[int, str]:
    """Version index -> name defined by this object."""
    out: dict[int, str] = {}
    data = r.read(section[1], section[2]) if section else None
    pos = 0
    while data is not None and len(out) < MAX_VERSION_ENTRIES and pos + 20 <= len(data):
        _, _, ndx, cnt, _, aux, nxt = struct.unpack_from(r.e + "HHHHIII", data, pos)
        if cnt and pos + aux + 8 <= len(data):
            out[ndx] = _string(strtab, struct.unpack_from(r.e + "I", data, pos + aux)[0])
        if not nxt:
            break
        pos += nxt
    return out


def _verneeds(
    r: _File, section: tuple[int, int, int, int, int] | None, strtab: bytes
) -> dict[int, tuple[str, str]]:
    """Version index -> (version name, library it is needed from)."""
    out: dict[int, tuple[str, str]] = {}
    data = r.read(section[1], section[2]) if section else None
    pos = 0
    while data is not None and len(out) < MAX_VERSION_ENTRIES and pos + 16 <= len(data):
        _, cnt, file_off, aux, nxt = struct.unpack_from(r.e + "HHIII", data, pos)
        library = _string(strtab, file_off)
        apos = pos + aux
        for _ in range(min(cnt, MAX_VERSION_ENTRIES)):
            if apos + 16 > len(data):
                break
            _, _, other, name, anext = struct.unpack_from(r.e + "IHHII", data, apos)
            out[other] = (_string(strtab, name), library)
            if not anext:
                break
            apos += anext
        if not nxt:
            break
        pos += nxt
    return out
