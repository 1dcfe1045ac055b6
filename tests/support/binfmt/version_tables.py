"""ELF files of section headers only, with hostile symbol-version tables: the inputs of
the binfmt scaling tests (tests/binfmt/test_scaling.py) and of the parser benchmark's
reproduction of the reported cases (benchmarks/parser_bench.py)."""

from __future__ import annotations

import struct

SHT_STRTAB, SHT_DYNSYM = 3, 11
SHT_VERSYM, SHT_VERDEF, SHT_VERNEED = 0x6FFFFFFF, 0x6FFFFFFD, 0x6FFFFFFE
SECTION = struct.Struct("<IIQQQQIIQQ")
SYMBOL = struct.Struct("<IBBHQQ")
IMPORT = 0x12  # STB_GLOBAL << 4 | STT_FUNC, st_shndx 0: an undefined global function
# Indexes of the sections (0 is the null header) as sections_elf numbers them.
DYNSYM, DYNSTR = 1, 2


def sections_elf(*sections: tuple[int, bytes]) -> bytes:
    """An x86-64 ELF of section headers only: .dynsym, .dynstr, then the others given, as
    (sh_type, contents); .dynsym links to .dynstr, the version sections too."""
    body = bytearray(64)
    placed = []
    for kind, data in sections:
        body += bytes(-len(body) % 8)
        placed.append((kind, len(body), len(data)))
        body += data
    body += bytes(-len(body) % 8)
    shoff = len(body)
    body += bytes(64)
    for kind, offset, size in placed:
        entsize = {SHT_DYNSYM: 24, SHT_VERSYM: 2}.get(kind, 0)
        link = DYNSTR if kind != SHT_STRTAB else 0
        body += SECTION.pack(0, kind, 2, 0, offset, size, link, 0, 8, entsize)
    body[:64] = struct.pack(
        "<16sHHIQQQIHHHHHH", b"\x7fELF\x02\x01\x01" + bytes(9), 3, 62, 1, 0, 0, shoff, 0,
        64, 56, 0, 64, len(sections) + 1, 0,
    )  # fmt: skip
    return bytes(body)


def imports(count: int, name: int = 1) -> bytes:
    return bytes(24) + SYMBOL.pack(name, IMPORT, 0, 0, 0, 0) * count


def shared_chain(size: int) -> bytes:
    """A Verneed table of `size` bytes of identical 16-byte records, each one a Verneed
    (vn_cnt 65535, vn_aux 16, vn_next 16) and, read as a Vernaux, the next one's first
    version (vna_next 16). Every Verneed walks the rest of the table: size**2 / 512 steps,
    where the old reader's bound (distinct version indexes, here one) never came."""
    record = struct.pack("<HHIII", 1, 0xFFFF, 1, 16, 16)
    return record * (size // 16 - 1) + struct.pack("<HHIII", 1, 0xFFFF, 1, 16, 0)


def verneed_shared_chain(size: int) -> bytes:
    """The reported input (66 KB: 8 s): the shared chain as a file's Verneed table. The
    record budget counts every step of every walk, so it is refused."""
    dynstr = b"\0libc.so.6\0GLIBC_2.2.5\0"
    return sections_elf(
        (SHT_DYNSYM, imports(1)), (SHT_STRTAB, dynstr), (SHT_VERNEED, shared_chain(size))
    )


def verdef_long_name(size: int) -> bytes:
    """The reported 2 MiB file: half a name with no NUL until its end, half Verdef records
    (vd_next 28) whose Verdaux all name it. A reader that scans and decodes the name for
    each record does size**2 / 112 bytes of work."""
    half = size // 2
    dynstr = b"\0" + b"A" * (half - 2) + b"\0"
    count = half // 28
    record = struct.pack("<HHHHIIIII", 1, 0, 2, 1, 0, 20, 28, 1, 0)
    last = struct.pack("<HHHHIIIII", 1, 0, 2, 1, 0, 20, 0, 1, 0)
    table = record * (count - 1) + last
    return sections_elf((SHT_DYNSYM, imports(1)), (SHT_STRTAB, dynstr), (SHT_VERDEF, table))


def verneed_per_import(count: int) -> bytes:
    """`count` imports, import i needing version index 2 + i, each index given by its own
    Verneed and Vernaux naming the same two strings: well formed, only big. Past the
    record budget it is refused; a reader that kept the first 16,384 indexes left the
    rest of the imports without a version, checked by name only (failing open)."""
    dynstr = b"\0libfoo.so.1\0FOO_1.0\0s\0"
    versym = struct.pack(f"<{count + 1}H", 0, *range(2, count + 2))
    table = bytearray()
    for i in range(count):
        nxt = 0 if i == count - 1 else 32
        table += struct.pack("<HHIII", 1, 1, 1, 16, nxt)
        table += struct.pack("<IHHII", 0, 0, 2 + i, 13, 0)
    return sections_elf(
        (SHT_DYNSYM, imports(count, name=21)), (SHT_STRTAB, dynstr),
        (SHT_VERSYM, versym), (SHT_VERNEED, bytes(table)),
    )  # fmt: skip


def imports_long_name(size: int) -> bytes:
    """4,096 imports all naming the start of a `size`-byte name whose NUL is its last
    byte: one scan for the NUL costs the whole name."""
    dynstr = b"\0" + b"x" * size + b"\0"
    return sections_elf((SHT_DYNSYM, imports(4096)), (SHT_STRTAB, dynstr))
