"""Hostile ELF files, generated: each one aims at a different bound of `read_elf`.

Shared by tests/binfmt/test_hostile_corpus.py (generous bounds) and
benchmarks/parser_bench.py (exact figures). Every entry is bytes, except the sparse file,
which is written to disk because its point is its 2 GB size.
"""

from __future__ import annotations

import contextlib
import struct
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from tests.support.binfmt.elfbuild import DT

EM_AARCH64, EM_ARM = 183, 40
PT_LOAD, PT_DYNAMIC, PT_INTERP, PT_NOTE = 1, 2, 3, 4
BASE = 0x400000
T = TypeVar("T")


def raw_elf64(
    dynamic: list[tuple[int, int]],
    strtab: bytes,
    machine: int = EM_AARCH64,
    extra: bytes = b"",
    phnum: int | None = None,
) -> bytes:
    """An ELF64 LE file: header, PT_LOAD (whole file), PT_DYNAMIC, then `strtab`, `extra`.

    DT_STRTAB/DT_STRSZ are added first; `dynamic` entries follow as given, then DT_NULL.
    Addresses in `dynamic` may use `BASE + offset_of("extra")`: `extra` starts at
    extra_offset(len(dynamic), len(strtab)).
    """
    phdrs = 2
    dyn_off = 64 + 56 * phdrs
    entries = [(DT["STRTAB"], 0), (DT["STRSZ"], len(strtab)), *dynamic, (DT["NULL"], 0)]
    str_off = dyn_off + 16 * len(entries)
    entries[0] = (DT["STRTAB"], BASE + str_off)
    dyn = b"".join(struct.pack("<qQ", t, v) for t, v in entries)
    body = dyn + strtab + extra
    size = dyn_off + len(body)
    ehdr = struct.pack(
        "<16sHHIQQQIHHHHHH", b"\x7fELF\x02\x01\x01" + bytes(9), 3, machine, 1, 0, 64, 0, 0,
        64, 56, phnum if phnum is not None else phdrs, 64, 0, 0,
    )  # fmt: skip
    load = struct.pack("<IIQQQQQQ", PT_LOAD, 5, 0, BASE, BASE, size, size, 0x1000)
    dynamic_ph = struct.pack("<IIQQQQQQ", PT_DYNAMIC, 6, dyn_off, BASE + dyn_off,
                             BASE + dyn_off, len(dyn), len(dyn), 8)  # fmt: skip
    return ehdr + load + dynamic_ph + body


def extra_offset(n_dynamic: int, strtab_len: int) -> int:
    return 64 + 56 * 2 + 16 * (n_dynamic + 3) + strtab_len


def string_reuse_bomb() -> bytes:
    """The reproduced crash: 8189 DT_RPATH/DT_RUNPATH entries naming one 4 KiB "ab:ab:…".

    134 KB; before the fix one parse held a split copy per entry (11 million strings):
    seconds and hundreds of MB, enough to OOM-kill the agent.
    """
    text = b"\0" + b"ab:" * 1364 + b"ab\0"
    tags = [DT["RPATH"], DT["RUNPATH"]]
    return raw_elf64([(DT["NEEDED"], 1)] + [(tags[i % 2], 1) for i in range(8188)], text)


def string_offsets_bomb() -> bytes:
    """8189 DT_RUNPATH entries at distinct offsets of one 4 KiB string: 8 MB of suffixes."""
    text = b"\0" + b"/a:" * 1365 + b"\0"
    return raw_elf64([(DT["RUNPATH"], 1 + i % 4090) for i in range(8189)], text)


def many_distinct_needed() -> bytes:
    """8189 distinct DT_NEEDED names: far more libraries than any loader run maps."""
    names = [f"l{i}".encode() for i in range(8189)]
    text = b"\0" + b"\0".join(names) + b"\0"
    offsets, pos = [], 1
    for n in names:
        offsets.append(pos)
        pos += len(n) + 1
    return raw_elf64([(DT["NEEDED"], o) for o in offsets], text)


def huge_phnum() -> bytes:
    """e_phnum = 65535: a 3.6 MB program header table, past binfmt_elf.c's 64 KiB limit."""
    return raw_elf64([], b"\0", phnum=0xFFFF) + bytes(0xFFFF * 56)


def max_phnum() -> bytes:
    """1170 program headers (the 64 KiB the kernel accepts), all PT_LOAD."""
    count = 65536 // 56
    ehdr = struct.pack("<16sHHIQQQIHHHHHH", b"\x7fELF\x02\x01\x01" + bytes(9), 2,
                       EM_AARCH64, 1, 0, 64, 0, 0, 64, 56, count, 64, 0, 0)  # fmt: skip
    size = 64 + count * 56
    load = struct.pack("<IIQQQQQQ", PT_LOAD, 5, 0, BASE, BASE, size, size, 0x1000)
    return ehdr + load * count


def huge_shnum_arm() -> bytes:
    """An ARM file with e_shnum = 65535 (2.6 MB of section headers) hiding .ARM.attributes."""
    shoff = 52 + 32
    ehdr = struct.pack("<16sHHIIIIIHHHHHH", b"\x7fELF\x01\x01\x01" + bytes(9), 2, EM_ARM,
                       1, 0, 52, shoff, 0x05000400, 52, 32, 1, 40, 0xFFFF, 0)  # fmt: skip
    size = shoff + 0xFFFF * 40
    load = struct.pack("<IIIIIIII", PT_LOAD, 0, 0x10000, 0x10000, size, size, 5, 0x1000)
    return ehdr + load + bytes(0xFFFF * 40)


def _version_chain(kind: str) -> bytes:
    """9000 chained Verneed or Verdef records and a count of 2**40.

    vn_next/vd_next are unsigned, so a chain cannot point back; the longest walk is a chain
    of minimal records through the file, which the record budget cuts.
    """
    text = b"\0lib\0"
    record_off = extra_offset(4, len(text))
    if kind == "verneed":  # vn_version, vn_cnt=0, vn_file, vn_aux, vn_next
        extra = struct.pack("<HHIII", 1, 0, 1, 0, 16) * 9000
        tags = (DT["VERNEED"], DT["VERNEEDNUM"])
    else:  # vd_version, vd_flags, vd_ndx, vd_cnt=0, vd_hash, vd_aux, vd_next
        extra = struct.pack("<HHHHIII", 1, 0, 1, 0, 0, 0, 20) * 9000
        tags = (DT["VERDEF"], DT["VERDEFNUM"])
    dynamic = [(DT["NEEDED"], 1), (DT["SONAME"], 1), (tags[0], BASE + record_off), (tags[1], 2**40)]
    return raw_elf64(dynamic, text, extra=extra)


def verneed_chain() -> bytes:
    return _version_chain("verneed")


def verdef_chain() -> bytes:
    return _version_chain("verdef")


def overlapping_tables() -> bytes:
    """DT_STRTAB points at the dynamic section itself and version records overlap it."""
    dyn_off = 64 + 56 * 2
    dynamic = [(DT["NEEDED"], 9), (DT["RUNPATH"], 17), (DT["VERNEED"], BASE + dyn_off),
               (DT["VERNEEDNUM"], 4096), (DT["VERDEF"], BASE), (DT["VERDEFNUM"], 4096)]  # fmt: skip
    data = bytearray(raw_elf64(dynamic, b"\0"))
    struct.pack_into("<Q", data, dyn_off + 8, BASE + dyn_off)  # DT_STRTAB = the dynamic section
    struct.pack_into("<Q", data, dyn_off + 24, 1 << 40)  # DT_STRSZ: the whole address space
    return bytes(data)


def long_unterminated_string() -> bytes:
    """A string table of 16 MiB of 'a' with no NUL: the string cap stops the read."""
    return raw_elf64([(DT["NEEDED"], 0)], b"a" * ((16 << 20) - 512))


def dynsym_suffix_bomb() -> bytes:
    """262,143 undefined global symbols in .dynsym naming 3,999 suffixes of one 4 KB name.

    6 MB. For readers of the section headers' symbol table (read_elf ignores sections): a
    reader that decodes each symbol's name anew holds ~2 KB per symbol.
    """
    count = (1 << 18) - 1
    dynstr = b"\0" + b"x" * 4000 + b"\0"
    symbol = struct.Struct("<IBBHQQ")  # st_name, st_info (global, notype), other, shndx 0
    dynsym = bytes(24) + b"".join(symbol.pack(1 + i % 3999, 0x10, 0, 0, 0, 0) for i in range(count))
    dynsym_off = 64
    dynstr_off = dynsym_off + len(dynsym)
    shoff = dynstr_off + len(dynstr)
    section = struct.Struct("<IIQQQQIIQQ")
    shdrs = bytes(64) + section.pack(0, 11, 0, 0, dynsym_off, len(dynsym), 2, 0, 8, 24)
    shdrs += section.pack(0, 3, 0, 0, dynstr_off, len(dynstr), 0, 0, 1, 0)
    ehdr = struct.pack("<16sHHIQQQIHHHHHH", b"\x7fELF\x02\x01\x01" + bytes(9), 3, 62, 1, 0,
                       0, shoff, 0, 64, 56, 0, 64, 3, 0)  # fmt: skip
    return ehdr + dynsym + dynstr + shdrs


def note_segments() -> bytes:
    """An x86-64 file with 1170 PT_NOTE segments, each 4 KiB of notes that are not GNU
    property notes: the ISA-level reader looks at the last 16 and needs nothing."""
    count = 65536 // 56
    phoff = 64
    notes_off = phoff + count * 56
    one = struct.pack("<III", 4, 8, 1) + b"GNU\0" + b"abcdefgh"
    notes = one * (4096 // len(one) + 1)
    ehdr = struct.pack("<16sHHIQQQIHHHHHH", b"\x7fELF\x02\x01\x01" + bytes(9), 2, 62, 1, 0,
                       phoff, 0, 0, 64, 56, count, 64, 0, 0)  # fmt: skip
    note = struct.pack("<IIQQQQQQ", PT_NOTE, 4, notes_off, BASE + notes_off, BASE + notes_off,
                       len(notes), len(notes), 8)  # fmt: skip
    return ehdr + note * count + notes


CORPUS: dict[str, Callable[[], bytes]] = {
    "string-reuse-bomb": string_reuse_bomb,
    "string-offsets-bomb": string_offsets_bomb,
    "8189-distinct-needed": many_distinct_needed,
    "huge-e_phnum": huge_phnum,
    "max-e_phnum": max_phnum,
    "huge-e_shnum-arm": huge_shnum_arm,
    "verneed-chain": verneed_chain,
    "verdef-chain": verdef_chain,
    "overlapping-tables": overlapping_tables,
    "16MiB-unterminated-string": long_unterminated_string,
    "dynsym-suffix-bomb": dynsym_suffix_bomb,
    "1170-note-segments": note_segments,
}


SHT_STRTAB, SHT_DYNSYM, SHT_HASH, SHT_GNU_HASH = 3, 11, 5, 0x6FFFFFF6
GLOBAL_FUNC = 0x12  # st_info: STB_GLOBAL << 4 | STT_FUNC


def symbol_table_elf(
    symbols: list[tuple[int, int]], dynstr: bytes, kind: int, table: bytes
) -> bytes:
    """An x86-64 ELF of section headers only: .dynsym (null symbol, then `symbols` as
    (st_name, st_shndx), global functions), .dynstr and a hash section of `kind`."""
    entry = struct.Struct("<IBBHQQ")
    dynsym = bytes(24) + b"".join(
        entry.pack(name, GLOBAL_FUNC, 0, shndx, 0, 0) for name, shndx in symbols
    )
    dynsym_off = 64
    dynstr_off = dynsym_off + len(dynsym)
    hash_off = dynstr_off + len(dynstr)
    shoff = hash_off + len(table)
    section = struct.Struct("<IIQQQQIIQQ")
    shdrs = bytes(64) + section.pack(0, SHT_DYNSYM, 2, 0, dynsym_off, len(dynsym), 2, 1, 8, 24)
    shdrs += section.pack(0, SHT_STRTAB, 2, 0, dynstr_off, len(dynstr), 0, 0, 1, 0)
    shdrs += section.pack(0, kind, 2, 0, hash_off, len(table), 1, 0, 8, 4)
    ehdr = struct.pack("<16sHHIQQQIHHHHHH", b"\x7fELF\x02\x01\x01" + bytes(9), 3, 62, 1, 0,
                       0, shoff, 0, 64, 56, 0, 64, 4, 0)  # fmt: skip
    return ehdr + dynsym + dynstr + table + shdrs


def gnu_hash(name: bytes) -> int:
    h = 5381
    for c in name:
        h = (h * 33 + c) & 0xFFFFFFFF
    return h


def gnu_hash_section(chain: list[int], nbuckets: int = 1, bloom_words: int = 1) -> bytes:
    """One bucket pointing at symbol 1 (symoffset 1), a zero bloom filter, then `chain`."""
    head = struct.pack("<IIII", nbuckets, 1, bloom_words, 6) + bytes(8 * bloom_words)
    return (
        head
        + struct.pack(f"<{nbuckets}I", *[1] * nbuckets)
        + struct.pack(f"<{len(chain)}I", *chain)
    )


def gnu_hash_endless_chain() -> bytes:
    """262,143 symbols in one GNU hash bucket, none marked as the chain's end, every entry
    carrying the hash of the name looked up ("a") while the symbols are named "b": a lookup
    without a bound compares 262,143 names, and again for every name asked."""
    count = (1 << 18) - 1
    decoy = gnu_hash(b"a") & ~1
    return symbol_table_elf(
        [(1, 1)] * count, b"\0b\0", SHT_GNU_HASH, gnu_hash_section([decoy] * count)
    )


def gnu_hash_long_chains() -> bytes:
    """1,000 real names s0..s999 in one bucket: finding s999 walks 1,000 entries, and a
    caller asking for each in turn walks half a million."""
    names = [f"s{i}".encode() for i in range(1000)]
    dynstr, offsets = b"\0", []
    for n in names:
        offsets.append(len(dynstr))
        dynstr += n + b"\0"
    chain = [gnu_hash(n) & ~1 for n in names]
    chain[-1] |= 1
    return symbol_table_elf(
        [(o, 1) for o in offsets], dynstr, SHT_GNU_HASH, gnu_hash_section(chain)
    )


def gnu_hash_lying_counts() -> bytes:
    """nbuckets and the bloom size say 2^32 - 1 in a 16-byte section."""
    table = struct.pack("<IIII", 0xFFFFFFFF, 1, 0xFFFFFFFF, 6)
    return symbol_table_elf([(1, 1)], b"\0a\0", SHT_GNU_HASH, table)


def sysv_hash_loop() -> bytes:
    """A .hash chain that points back at itself (symbol 2 -> 1 -> 2 ...)."""
    nchain = 3
    table = struct.pack("<II", 1, nchain) + struct.pack("<I", 1) + struct.pack("<III", 0, 2, 1)
    return symbol_table_elf([(1, 1), (1, 1)], b"\0b\0", SHT_HASH, table)


def gnu_hash_cut_word() -> bytes:
    """A .gnu.hash whose size ends 3 bytes into a word, its chain without an end mark."""
    table = gnu_hash_section([2, 2, 2]) + b"\x01\x02\x03"
    return symbol_table_elf([(1, 1)] * 4, b"\0a\0", SHT_GNU_HASH, table)


# Hostile hash tables for the missing-symbol check's export lookup (read_elf ignores them).
SYMBOL_CORPUS: dict[str, Callable[[], bytes]] = {
    "gnu-hash-cut-word": gnu_hash_cut_word,
    "gnu-hash-endless-chain": gnu_hash_endless_chain,
    "gnu-hash-long-chains": gnu_hash_long_chains,
    "gnu-hash-lying-counts": gnu_hash_lying_counts,
    "sysv-hash-loop": sysv_hash_loop,
}


def sparse_elf(path: Path, size: int = 2 << 30) -> Path:
    """A 2 GB sparse ELF whose dynamic section and strings sit 2 GB in, past holes."""
    dyn_off = size - 4096
    dyn = struct.pack("<qQqQqQqQ", DT["NEEDED"], 1, DT["STRTAB"], BASE + dyn_off + 64,
                      DT["STRSZ"], 64, DT["NULL"], 0)  # fmt: skip
    head = raw_elf64([], b"\0")[:64]
    head = head[:56] + struct.pack("<H", 2) + head[58:]
    load = struct.pack("<IIQQQQQQ", PT_LOAD, 5, 0, BASE, BASE, size, size, 0x1000)
    dyn_ph = struct.pack("<IIQQQQQQ", PT_DYNAMIC, 6, dyn_off, BASE + dyn_off,
                         BASE + dyn_off, len(dyn), len(dyn), 8)  # fmt: skip
    with open(path, "wb") as f:
        f.write(head + load + dyn_ph)
        f.seek(dyn_off)
        f.write(dyn.ljust(64, b"\0") + b"\0libc.so.6\0")
        f.truncate(size)
    return path


@dataclass(frozen=True)
class Cost:
    seconds: float  # best of `repeat` runs, without tracemalloc
    peak_bytes: int  # tracemalloc peak of one run


def measure(fn: Callable[[], T], repeat: int = 3) -> tuple[T | BaseException, Cost]:
    """Run `fn`: its result (or exception), its best time and its peak Python allocation."""
    best = float("inf")
    outcome: T | BaseException
    for _ in range(repeat):
        start = time.perf_counter()
        try:
            outcome = fn()
        except Exception as exc:
            outcome = exc
        best = min(best, time.perf_counter() - start)
    tracemalloc.start()
    try:
        with contextlib.suppress(Exception):
            fn()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return outcome, Cost(best, peak)
