"""Dynamic symbols: what an ELF object imports (with the version it asks for), and whether
it exports a given name, looked up through its hash table as ld.so does.

Read from the section headers' .dynsym, its string table, the GNU version sections and
.gnu.hash (else .hash). Only the imports are decoded. An export is found by hashing the
wanted name and comparing it with the few symbols of its hash chain (`elf/dl-lookup.c`), so
libLLVM's 91,000 exports cost one read of the tables and then microseconds per name asked
for, instead of 250 ms to decode them all. Without any hash table, the exports are decoded
into a set.

Every read runs on one budget per file (`SymbolWork`, limits in `SymbolLimits`): bytes read,
version records walked, name bytes decoded, loop steps and wall time, each checked inside
its loop. Every version record is unpacked once per offset and every name decoded once per
offset, at most MAX_STRING_BYTES of it scanned for its end; a record reached again (Debian's
libjansson.so.4 shares one Verdaux between two Verdefs) is taken from a cache, but still
counts as a step of the walk, so a chain that every record re-walks (a 66 KB Verneed table
cost 8 s) runs out of budget. Past a bound the reader raises ParseLimitExceeded: never a
partial table that would read as "nothing missing". An object without section headers, or
whose tables lie outside the file, gives None (unknown), and a lookup in a broken hash
table None.
"""

from __future__ import annotations

import functools
import itertools
import operator
import os
import struct
import sys
import time
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import BinaryIO, NamedTuple, TypeAlias

from execwatch.binfmt.elf import ElfInfo
from execwatch.binfmt.errors import ParseLimitExceeded

SHT_HASH = 5
SHT_DYNSYM = 11
SHT_GNU_HASH = 0x6FFFFFF6
SHT_GNU_VERDEF = 0x6FFFFFFD
SHT_GNU_VERNEED = 0x6FFFFFFE
SHT_GNU_VERSYM = 0x6FFFFFFF
STB_GLOBAL, STB_WEAK, STB_GNU_UNIQUE = 1, 2, 10
EXPORTED_BINDINGS = (STB_GLOBAL, STB_WEAK, STB_GNU_UNIQUE)
IMPORTED_BINDINGS = (STB_GLOBAL, STB_GNU_UNIQUE)  # an undefined weak symbol may stay unbound
MAX_TABLE_BYTES = 16 << 20
# Every table of one file together. The biggest on a Debian /usr (containerd) are 8.4 MiB.
MAX_READ_BYTES = 32 << 20
MAX_SYMBOLS = 1 << 18  # libLLVM exports 89,000; more is refused
MAX_IMPORTS = 1 << 15  # undefined symbols kept; python3.11 imports 511, libLLVM 524
# Name bytes sliced or decoded, imports counted with their repeats; libLLVM's are 3 MiB.
MAX_NAME_BYTES = 6 << 20
# One name. The longest of a Debian /usr is 673 bytes; a C++ template name can reach a few
# KiB. Bounds the scan for a name's NUL, which would otherwise run to the table's end.
MAX_STRING_BYTES = 32 << 10
MAX_SECTIONS = 1 << 16
# Verneed, Vernaux, Verdef and Verdaux records visited; the most on a Debian /usr is 72
# (the ELF reader allows as many: ElfLimits.max_version_records).
MAX_RECORDS = 8192
# Loop steps: section headers, symbols walked, chunks of imports, records.
MAX_STEPS = 1 << 20
# Wall time, checked in every loop: the bounds above keep real files to milliseconds; this
# is the backstop for a starved CPU (as elf.ElfLimits.max_seconds).
MAX_SECONDS = 2.0
MAX_OFFSET = 1 << 62  # beyond any file; a larger one would not even fit a seek (ssize_t)
# Symbols compared along one hash chain. ld sizes the buckets for chains of a few symbols
# (libLLVM's longest is 17); a chain without its end mark would walk the whole table.
MAX_CHAIN_STEPS = 1024
# Chain entries walked in one object, on average over its lookups, past a first allowance.
# ld sizes the buckets for short chains: scanning a Debian /usr, the busiest library walks
# 1.9 per lookup and the worst object 5.2. An object whose chains are longer (a hostile one
# making each of 32,768 imports walk 1,024 entries) answers unknown from then on.
MAX_AVERAGE_STEPS = 64
FREE_STEPS = 1 << 16
HASH_CACHE = 1 << 16  # names whose hashes are kept: every executable asks for libc's again
CHUNK = 4096  # symbols decoded together by _imports
# st_info -> 1 if its binding is one an import must be bound with, else 0
_IMPORTED_INFO = bytes(int(info >> 4 in IMPORTED_BINDINGS) for info in range(256))
_IS_ZERO = bytes([1]) + bytes(255)

Section = tuple[int, int, int, int, int]  # type, offset, size, link, entsize
# sh_type, sh_offset, sh_size, sh_link, sh_entsize of an Elf64_Shdr / Elf32_Shdr
_SHDR64, _SHDR32 = "4xI16xQQI12xQ", "4xI8xIII8xI"


@dataclass(frozen=True)
class SymbolLimits:
    """The budget of reading one file's symbols."""

    max_read_bytes: int = MAX_READ_BYTES
    max_records: int = MAX_RECORDS
    max_name_bytes: int = MAX_NAME_BYTES
    max_steps: int = MAX_STEPS
    max_seconds: float = MAX_SECONDS


DEFAULT_LIMITS = SymbolLimits()


@dataclass
class SymbolWork:
    """What reading one file has cost so far; ParseLimitExceeded as soon as a bound is passed.

    Also the deterministic measure of the scaling tests: every loop of the reader charges
    its steps here, so work proportional to the input shows as counts, not only as time.
    """

    limits: SymbolLimits = DEFAULT_LIMITS
    read_bytes: int = 0
    records: int = 0
    name_bytes: int = 0
    steps: int = 0
    deadline: float = field(default=0.0, repr=False)

    def __post_init__(self) -> None:
        if not self.deadline:
            self.deadline = time.monotonic() + self.limits.max_seconds

    def read(self, size: int) -> None:
        self.read_bytes += size
        if self.read_bytes > self.limits.max_read_bytes:
            raise ParseLimitExceeded(
                f"more than {self.limits.max_read_bytes} bytes of symbol tables"
            )
        self.step()

    def step(self, count: int = 1) -> None:
        self.steps += count
        if self.steps > self.limits.max_steps:
            raise ParseLimitExceeded(f"more than {self.limits.max_steps} steps reading symbols")
        if time.monotonic() > self.deadline:
            raise ParseLimitExceeded(f"reading symbols took more than {self.limits.max_seconds}s")

    def names(self, size: int) -> None:
        self.name_bytes += size
        if self.name_bytes > self.limits.max_name_bytes:
            raise ParseLimitExceeded(
                f"more than {self.limits.max_name_bytes} bytes of symbol names"
            )

    def record(self) -> None:
        """One step of a walk through version records, whether read before or not."""
        if self.records >= self.limits.max_records:
            raise ParseLimitExceeded(f"more than {self.limits.max_records} symbol version records")
        self.records += 1
        self.step()


class SymbolRef(NamedTuple):
    key: bytes  # the name as stored, compared byte for byte as ld.so does
    version: str | None  # GLIBC_2.38, CURL_OPENSSL_4
    library: str | None  # the DT_NEEDED name the version is required from

    @property
    def name(self) -> str:
        return self.key.decode(errors="replace")


_new_ref = tuple.__new__  # SymbolRef without NamedTuple's Python-level __new__


class DynamicSymbols:
    """An object's imports (undefined, not weak) and a lookup of what it exports."""

    def __init__(
        self, imports: tuple[SymbolRef, ...], exports: _Exports | frozenset[str] = frozenset()
    ) -> None:
        self.imports = imports
        self._exports = exports
        held = exports.size if isinstance(exports, _Exports) else 64 * len(exports)
        self.size = held + 64 * len(imports)  # bytes, roughly: for a cache's budget

    def defines(self, ref: SymbolRef) -> bool | None:
        """Whether a defined global symbol has this name (and this version, if one is asked
        for); None when the hash table is broken: unknown."""
        if isinstance(self._exports, _Exports):
            return self._exports.defines(ref)
        if ref.version is not None:
            return f"{ref.name}@{ref.version}" in self._exports
        return ref.name in self._exports


class _File:
    def __init__(self, f: BinaryIO, info: ElfInfo, work: SymbolWork) -> None:
        self.f = f
        self.e = "<" if info.little_endian else ">"
        self.wide = info.bits == 64
        self.work = work
        self.size = f.seek(0, os.SEEK_END)

    def read(self, offset: int, size: int) -> bytes | None:
        """The bytes, or None when they lie outside the file (unknown, not hostile)."""
        if not 0 <= offset <= MAX_OFFSET or size < 0 or offset + size > self.size:
            return None
        if size > MAX_TABLE_BYTES:
            raise ParseLimitExceeded(f"a symbol table of more than {MAX_TABLE_BYTES} bytes")
        self.work.read(size)
        self.f.seek(offset)
        data = self.f.read(size)
        return data if len(data) == size else None


class _Unknown(Exception):
    """A table lies outside the file: the object's symbols are unknown (None)."""


def read_dynamic_symbols(
    f: BinaryIO, info: ElfInfo, imports: bool = True, work: SymbolWork | None = None
) -> DynamicSymbols | None:
    """The object's symbols; without its imports when `imports` is False (a provider
    library is only asked what it exports: decoding its imports was a sixth of a scan).
    None when unknown; ParseLimitExceeded past the budget (`work`: a fresh one by default)."""
    try:
        return _read(_File(f, info, work or SymbolWork()), imports)
    except _Unknown:
        return None


def _read(r: _File, imports: bool) -> DynamicSymbols:
    sections = _sections(r)
    by_type = {s[0]: s for s in reversed(sections)}
    dynsym = by_type.get(SHT_DYNSYM)
    if dynsym is None:
        return DynamicSymbols(())
    _, offset, size, link, entsize = dynsym
    if link >= len(sections) or not entsize:
        raise _Unknown
    if size // entsize > MAX_SYMBOLS:
        raise ParseLimitExceeded(f"more than {MAX_SYMBOLS} dynamic symbols")
    strtab = _need(r.read(sections[link][1], sections[link][2]))
    symbols = _Symbols(r, _need(r.read(offset, size)), entsize, strtab)
    versym = _versym(r, by_type.get(SHT_GNU_VERSYM), symbols.count)
    names = _Names(strtab, r.work)
    imported: tuple[SymbolRef, ...] = ()
    if imports:  # the version needs serve only the imports
        needs = _verneeds(r, by_type.get(SHT_GNU_VERNEED), names)
        imported = _imports(symbols, versym, needs, r.work)
    defs = _verdefs(r, by_type.get(SHT_GNU_VERDEF), names)
    dynsym_index = sections.index(dynsym)
    for kind in (SHT_GNU_HASH, SHT_HASH):
        section = by_type.get(kind)
        if section is not None and section[3] == dynsym_index:
            data = _need(r.read(section[1], section[2]))
            return DynamicSymbols(imported, _Exports(symbols, versym, defs, kind, data))
    return DynamicSymbols(imported, _export_set(symbols, versym, defs, names))


def _need(data: bytes | None) -> bytes:
    if data is None:
        raise _Unknown
    return data


def _imports(
    symbols: _Symbols, versym: array[int], needs: dict[int, tuple[str, str]], work: SymbolWork
) -> tuple[SymbolRef, ...]:
    """The hot loop of a scan (every executable's every import), run a chunk of symbols at
    a time through C-level maps rather than a Python statement per symbol. Every name's
    bytes count against the name budget before it is sliced, repeats included, and the
    search for its end stops after MAX_STRING_BYTES."""
    strtab = symbols.strtab
    if not strtab.endswith(b"\0"):  # a name running off the table's end is no name
        strtab = strtab[: strtab.rfind(b"\0") + 1]
    last = len(strtab) - 1  # an offset past the table is clamped onto its final NUL
    find, cut = strtab.find, strtab.__getitem__
    name_at, info = symbols.columns()
    if len(versym) < symbols.count:  # no version for a symbol past the table: index 0
        versym = versym + array("H", bytes(2 * (symbols.count - len(versym))))
    versions = {index: need[0] for index, need in needs.items()}
    libraries = {index: need[1] for index, need in needs.items()}
    picked = symbols.imported(info)
    imports: list[SymbolRef] = []
    nul, longest = itertools.repeat(b"\0"), itertools.repeat(MAX_STRING_BYTES + 1)
    while chunk := list(itertools.islice(picked, CHUNK)):
        work.step(len(chunk))
        offsets = list(map(name_at.__getitem__, chunk))
        if max(offsets) > last:
            offsets = list(map(min, offsets, itertools.repeat(last)))
        ends = list(map(find, nul, offsets, map(operator.add, offsets, longest)))
        if -1 in ends:
            raise ParseLimitExceeded(f"a symbol name longer than {MAX_STRING_BYTES} bytes")
        work.names(sum(ends) - sum(offsets))
        names = list(map(cut, map(slice, offsets, ends)))
        hidden = itertools.repeat(0x7FFF)  # the hidden bit is no part of the version index
        index = list(map(operator.and_, map(versym.__getitem__, chunk), hidden))
        refs = zip(names, map(versions.get, index), map(libraries.get, index), strict=True)
        imports += map(_new_ref, itertools.repeat(SymbolRef), itertools.compress(refs, names))
        if len(imports) > MAX_IMPORTS:
            raise ParseLimitExceeded(f"more than {MAX_IMPORTS} imported symbols")
    return tuple(imports)


def _export_set(
    symbols: _Symbols, versym: array[int], defs: dict[int, str], names: _Names
) -> frozenset[str]:
    """Every defined global name, and name@version: for an object without a hash table."""
    exports: set[str] = set()
    for i in range(symbols.count):
        if i % CHUNK == 0:
            symbols.work.step(CHUNK)
        name_off, bind, shndx = symbols[i]
        if shndx == 0 or bind not in EXPORTED_BINDINGS:
            continue
        name = names.text(name_off)
        if name:
            exports.add(name)
            ver = versym[i] & 0x7FFF if i < len(versym) else 0
            if ver in defs:
                exports.add(f"{name}@{defs[ver]}")
    return frozenset(exports)


class _Symbols:
    """The raw .dynsym: (name offset, binding, section index) of symbol i, on demand."""

    def __init__(self, r: _File, table: bytes, entsize: int, strtab: bytes) -> None:
        self.order, self.wide, self.work = r.e, r.wide, r.work
        if r.wide:  # st_name, st_info, st_other, st_shndx
            self.entry, self.info_at, self.shndx_at, want = struct.Struct(r.e + "IBBH"), 1, 3, 24
        else:  # st_name, st_value, st_size, st_info, st_other, st_shndx
            self.entry, self.info_at, self.shndx_at, want = struct.Struct(r.e + "IIIBBH"), 3, 5, 16
        self.table, self.strtab, self.entsize = table, strtab, entsize
        self.count = len(table) // entsize if entsize >= want else 0

    def __getitem__(self, i: int) -> tuple[int, int, int]:
        fields = self.entry.unpack_from(self.table, i * self.entsize)
        return fields[0], fields[self.info_at] >> 4, fields[self.shndx_at]

    def imported(self, info: bytes) -> Iterator[int]:
        """Indices of the undefined symbols (st_shndx 0) with an import's binding, given the
        st_info column. A library's or a big program's table is mostly defined symbols: the
        columns are sliced out as bytes and tested together as one big integer, in C."""
        used, at = self.count * self.entsize, 6 if self.wide else 14  # st_shndx, 2 bytes
        low = self.table[at : used : self.entsize].translate(_IS_ZERO)
        high = self.table[at + 1 : used : self.entsize].translate(_IS_ZERO)
        wanted = info.translate(_IMPORTED_INFO)
        both = int.from_bytes(wanted) & int.from_bytes(low) & int.from_bytes(high)
        return itertools.compress(range(self.count), both.to_bytes(self.count))

    def columns(self) -> tuple[Sequence[int], bytes]:
        """st_name and st_info of every symbol, as columns sliced in C where the table's
        layout allows (no tuple per symbol); unpacked entry by entry where it does not."""
        used = self.count * self.entsize
        info = self.table[(4 if self.wide else 12) : used : self.entsize]
        native = (self.order == "<") == (sys.byteorder == "little")
        if native and self.entsize % 4 == 0:
            return memoryview(self.table)[:used].cast("I")[:: self.entsize // 4], info
        unpack = self.entry.unpack_from
        return [unpack(self.table, i * self.entsize)[0] for i in range(self.count)], info

    def named(self, i: int, key: bytes) -> bool:
        """Symbol i is a defined global one named exactly `key`."""
        fields = self.entry.unpack_from(self.table, i * self.entsize)
        name_off, end = fields[0], fields[0] + len(key)
        return (
            fields[self.shndx_at] != 0
            and fields[self.info_at] >> 4 in EXPORTED_BINDINGS
            and end < len(self.strtab)
            and self.strtab[end] == 0
            and self.strtab.startswith(key, name_off)
        )


class _Exports:
    """Exported symbols found through .gnu.hash or .hash, as `_dl_lookup_symbol_x` does."""

    def __init__(
        self, symbols: _Symbols, versym: array[int], defs: dict[int, str], kind: int, data: bytes
    ) -> None:
        self.symbols, self.versym, self.defs = symbols, versym, defs
        self.gnu = kind == SHT_GNU_HASH
        parse = _gnu_hash_table if self.gnu else _sysv_hash_table
        self.buckets, self.chain, self.symoffset = parse(data, symbols)
        self.steps = 0  # chain entries walked, over every lookup
        self.lookups = 0
        self.broken = False
        self.size = (
            len(symbols.table)
            + len(symbols.strtab)
            + 2 * len(versym)
            + 4 * (len(self.buckets) + len(self.chain))
        )

    def defines(self, ref: SymbolRef) -> bool | None:
        self.lookups += 1
        if self.steps > FREE_STEPS + MAX_AVERAGE_STEPS * self.lookups:
            self.broken = True
        if self.broken or not self.buckets:
            return None  # a hash section we cannot read, or one that made us walk too far
        key = ref.key
        return self._gnu(key, ref.version) if self.gnu else self._sysv(key, ref.version)

    def _gnu(self, key: bytes, version: str | None) -> bool | None:
        h = _gnu_hash(key)
        i = self.buckets[h % len(self.buckets)]
        if i == 0:
            return False
        for step in range(MAX_CHAIN_STEPS):
            j = i - self.symoffset
            if not 0 <= j < len(self.chain) or i >= self.symbols.count:
                break
            entry = self.chain[j]
            if entry | 1 == h | 1 and self._matches(i, key, version):
                self.steps += step + 1
                return True
            if entry & 1:
                self.steps += step + 1
                return False
            i += 1
        self.broken = True  # every later answer is unknown too
        return None

    def _sysv(self, key: bytes, version: str | None) -> bool | None:
        i = self.buckets[_sysv_hash(key) % len(self.buckets)]
        for step in range(MAX_CHAIN_STEPS):
            if i == 0:
                self.steps += step + 1
                return False
            if i >= self.symbols.count or i >= len(self.chain):
                break
            if self._matches(i, key, version):
                self.steps += step + 1
                return True
            i = self.chain[i]
        self.broken = True
        return None

    def _matches(self, i: int, key: bytes, version: str | None) -> bool:
        if not self.symbols.named(i, key):
            return False
        if version is None:
            return True
        ver = self.versym[i] & 0x7FFF if i < len(self.versym) else 0
        return self.defs.get(ver) == version


_Table: TypeAlias = "tuple[array[int], array[int], int]"  # buckets, chain, symoffset
_EMPTY: _Table = (array("I"), array("I"), 0)


def _gnu_hash_table(data: bytes, symbols: _Symbols) -> _Table:
    """nbuckets, symoffset, bloom size, bloom shift; the bloom words; buckets; chain."""
    if len(data) < 16:
        return _EMPTY
    nbuckets, symoffset, bloom_words, _ = struct.unpack_from(symbols.order + "IIII", data)
    buckets_at = 16 + bloom_words * (8 if symbols.wide else 4)
    chain_at = buckets_at + 4 * nbuckets
    if not nbuckets or chain_at > len(data) or symoffset > symbols.count:
        return _EMPTY
    chain_end = min(len(data), chain_at + 4 * (symbols.count - symoffset))
    buckets = _words(data, buckets_at, chain_at, symbols.order)
    return buckets, _words(data, chain_at, chain_end, symbols.order), symoffset


def _sysv_hash_table(data: bytes, symbols: _Symbols) -> _Table:
    """nbucket, nchain; buckets; chain (one entry per symbol)."""
    if len(data) < 8:
        return _EMPTY
    nbucket, nchain = struct.unpack_from(symbols.order + "II", data)
    chain_at = 8 + 4 * nbucket
    if not nbucket or chain_at + 4 * nchain > len(data):
        return _EMPTY
    chain = _words(data, chain_at, chain_at + 4 * nchain, symbols.order)
    return _words(data, 8, chain_at, symbols.order), chain, 0


def _words(data: bytes, start: int, end: int, order: str) -> array[int]:
    end = start + (end - start) // 4 * 4  # a section cut inside its last word
    out = array("I", data[start:end])  # 4-byte items on every platform Python supports
    if (order == "<") != (sys.byteorder == "little"):
        out.byteswap()
    return out


@functools.lru_cache(maxsize=HASH_CACHE)
def _gnu_hash(name: bytes) -> int:
    h = 5381
    for c in name:
        h = h * 33 + c
    return h & 0xFFFFFFFF


@functools.lru_cache(maxsize=HASH_CACHE)
def _sysv_hash(name: bytes) -> int:
    h = 0
    for c in name:
        h = (h << 4) + c
        g = h & 0xF0000000
        h = (h ^ (g >> 24)) & ~g & 0xFFFFFFFF
    return h


def _sections(r: _File) -> list[Section]:
    """(type, offset, size, link, entsize) of each section header."""
    head = _need(r.read(0, 64))
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
        raise _Unknown
    raw = _need(r.read(shoff, shentsize * shnum))
    r.work.step(shnum)
    if shentsize == want:  # every real file: the wanted fields of each header, in C
        return list(struct.iter_unpack(r.e + (_SHDR64 if r.wide else _SHDR32), raw))
    out = []
    for i in range(shnum):
        _, kind, _, _, offset, size, link, _, _, entsize = struct.unpack_from(
            fmt, raw, i * shentsize
        )
        out.append((kind, offset, size, link, entsize))
    return out


class _Names:
    """Names of the string table, each offset sliced and decoded once: 262,000 symbols
    naming suffixes of one long string would otherwise hold a copy each (a 6 MB file,
    560 MB), and version records naming one offset would decode it anew each (quadratic)."""

    def __init__(self, strtab: bytes, work: SymbolWork) -> None:
        self.strtab = strtab
        self.work = work
        self.decoded: dict[int, str] = {}

    def text(self, offset: int) -> str:
        name = self.decoded.get(offset)
        if name is None:
            name = self.decoded[offset] = self._slice(offset).decode(errors="replace")
        return name

    def _slice(self, offset: int) -> bytes:
        if not 0 <= offset < len(self.strtab):
            return b""
        stop = offset + MAX_STRING_BYTES + 1
        end = self.strtab.find(b"\0", offset, stop)
        if end < 0:
            if stop < len(self.strtab):
                raise ParseLimitExceeded(f"a symbol name longer than {MAX_STRING_BYTES} bytes")
            return b""  # running off the table's end: no name
        self.work.names(end - offset)
        return self.strtab[offset:end]


def _versym(r: _File, section: Section | None, count: int) -> array[int]:
    """One version index per symbol; the rest of a longer section is never used."""
    out = array("H")
    if section is not None:
        out.frombytes(_need(r.read(section[1], min(section[2], 2 * count) & ~1)))
    if (r.e == "<") != (sys.byteorder == "little"):
        out.byteswap()
    return out


def _verdefs(r: _File, section: Section | None, names: _Names) -> dict[int, str]:
    """Version index -> name defined by this object (the name of its first Verdaux)."""
    out: dict[int, str] = {}
    if section is None:
        return out
    data = _need(r.read(section[1], section[2]))
    aux_names: dict[int, str] = {}  # Verdaux offset -> its name
    pos = 0  # vd_next is unsigned: every Verdef lies past the one before
    while pos + 20 <= len(data):
        r.work.record()
        _, _, ndx, cnt, _, aux, nxt = struct.unpack_from(r.e + "HHHHIII", data, pos)
        at = pos + aux
        if cnt and at + 8 <= len(data):
            r.work.record()
            name = aux_names.get(at)
            if name is None:
                name = aux_names[at] = names.text(struct.unpack_from(r.e + "I", data, at)[0])
            out[ndx] = name
        if not nxt:
            break
        pos += nxt
    return out


def _verneeds(r: _File, section: Section | None, names: _Names) -> dict[int, tuple[str, str]]:
    """Version index -> (version name, library it is needed from); for an index given twice,
    the last, as ld.so's `_dl_check_map_versions` fills its table."""
    out: dict[int, tuple[str, str]] = {}
    if section is None:
        return out
    data = _need(r.read(section[1], section[2]))
    vernaux: dict[int, tuple[int, str, int]] = {}  # offset -> vna_other, name, vna_next
    pos = 0  # vn_next and vna_next are unsigned: every walk only moves forward
    while pos + 16 <= len(data):
        r.work.record()
        _, cnt, file_off, aux, nxt = struct.unpack_from(r.e + "HHIII", data, pos)
        library = names.text(file_off)
        at = pos + aux
        for _ in range(cnt):
            if at + 16 > len(data):
                break
            r.work.record()
            entry = vernaux.get(at)
            if entry is None:
                _, _, other, name, anext = struct.unpack_from(r.e + "IHHII", data, at)
                entry = vernaux[at] = (other, names.text(name), anext)
            out[entry[0]] = (entry[1], library)
            if not entry[2]:
                break
            at += entry[2]
        if not nxt:
            break
        pos += nxt
    return out
