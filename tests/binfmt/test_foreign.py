"""Executables of other operating systems (binfmt/foreign.py, the ELF's ABI notes) and the
cause of a missing `#!` (binfmt/shebang.py): real Go cross-compiles, headers built to
each format's spec, hostile and mutated inputs on a fixed read budget."""

from __future__ import annotations

import io
import random
import struct
import time
from pathlib import Path

import pytest

from execwatch.binfmt import read_elf
from execwatch.binfmt.foreign import (
    MAX_READ_BYTES,
    MAX_READS,
    ForeignBinary,
    identify,
    identify_file,
    identify_stream,
    of_elf,
)
from execwatch.binfmt.shebang import missing_shebang_cause
from tests.support.binfmt.foreignos import BUILT, elf_with_note, universal


class CountingFile(io.BytesIO):
    """Counts the bytes handed out: the identification's work on the file."""

    bytes_read = 0

    def read(self, size: int | None = -1) -> bytes:
        data = super().read(size)
        self.bytes_read += len(data)
        return data


def named(data: bytes) -> ForeignBinary | None:
    f = io.BytesIO(data)
    found = identify_file(f)
    if found is None and data[:4] == b"\x7fELF":
        return of_elf(read_elf(f))
    return found


# --- real executables: Go's GOOS=darwin, windows, freebsd, netbsd, openbsd ---------------


@pytest.mark.parametrize("name", sorted(BUILT))
def test_each_go_cross_compile_is_named_with_its_os_arch_and_format(
    foreign_os: dict[str, Path], name: str
) -> None:
    goos, arch, fmt = BUILT[name]
    found = named(foreign_os[name].read_bytes())
    assert found == ForeignBinary(goos, fmt, (arch,), executable=True), name
    assert found.detail().endswith(f": built with GOOS={goos}?")


def test_the_details_read_as_a_person_would_say_them(foreign_os: dict[str, Path]) -> None:
    details = {n: named(foreign_os[n].read_bytes()) for n in BUILT}
    assert {n: d.detail() for n, d in details.items() if d} == {
        "hello-darwin-amd64": "a macOS x86-64 executable (Mach-O): built with GOOS=darwin?",
        "hello-darwin-arm64": "a macOS arm64 executable (Mach-O): built with GOOS=darwin?",
        "hello-windows-amd64.exe": "a Windows x86-64 executable (PE): built with GOOS=windows?",
        "hello-freebsd-amd64": "a FreeBSD x86-64 executable (ELF): built with GOOS=freebsd?",
        "hello-netbsd-amd64": "a NetBSD x86-64 executable (ELF): built with GOOS=netbsd?",
        "hello-openbsd-amd64": "an OpenBSD x86-64 executable (ELF): built with GOOS=openbsd?",
    }


def test_a_universal_binary_of_two_real_slices_names_both(foreign_os: dict[str, Path]) -> None:
    fat = universal(*(foreign_os[f"hello-darwin-{a}"].read_bytes() for a in ("amd64", "arm64")))
    found = named(fat)
    assert found == ForeignBinary("darwin", "Mach-O", ("amd64", "arm64"))
    assert found.arch == "amd64+arm64"
    assert found.detail() == (
        "a macOS universal executable (Mach-O: x86-64 and arm64): built with GOOS=darwin?"
    )


# --- each format to its spec ---------------------------------------------------------------


def macho(magic: bytes, order: str, cputype: int, filetype: int = 2) -> bytes:
    return magic + struct.pack(order + "iiIIII", cputype, 3, filetype, 0, 0, 0) + bytes(64)


@pytest.mark.parametrize(
    ("data", "arch", "executable"),
    [
        (macho(b"\xcf\xfa\xed\xfe", "<", 0x01000007), "amd64", True),  # 64-bit, little-endian
        (macho(b"\xce\xfa\xed\xfe", "<", 7), "386", True),  # 32-bit, little-endian
        (macho(b"\xfe\xed\xfa\xce", ">", 18), "ppc", True),  # 32-bit, big-endian
        (macho(b"\xfe\xed\xfa\xcf", ">", 0x01000012), "ppc64", True),  # 64-bit, big-endian
        (macho(b"\xcf\xfa\xed\xfe", "<", 0x0100000C, filetype=6), "arm64", False),  # a dylib
    ],
)
def test_mach_o_in_both_classes_and_byte_orders(data: bytes, arch: str, executable: bool) -> None:
    assert named(data) == ForeignBinary("darwin", "Mach-O", (arch,), executable)


def pe(
    machine: int, characteristics: int = 0x0022, subsystem: int = 3, lfanew: int = 0x80
) -> bytes:
    dos = bytearray(b"MZ" + bytes(lfanew - 2))
    struct.pack_into("<I", dos, 0x3C, lfanew)
    coff = b"PE\0\0" + struct.pack("<HHIIIHH", machine, 3, 0, 0, 0, 240, characteristics)
    optional = bytearray(240)
    struct.pack_into("<HH", optional, 0, 0x20B, 0)
    struct.pack_into("<H", optional, 68, subsystem)
    return bytes(dos) + coff + bytes(optional)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (pe(0x8664), ForeignBinary("windows", "PE", ("amd64",))),
        (pe(0xAA64), ForeignBinary("windows", "PE", ("arm64",))),
        (pe(0x014C), ForeignBinary("windows", "PE", ("386",))),
        (pe(0x8664, characteristics=0x2022), ForeignBinary("windows", "PE", ("amd64",), False)),
        (pe(0xAA64, subsystem=10), ForeignBinary("uefi", "PE", ("arm64",))),  # an EFI app
        (pe(0x8664, lfanew=0x300), ForeignBinary("windows", "PE", ("amd64",))),  # past 1 KiB
    ],
)
def test_pe_machine_and_characteristics(data: bytes, expected: ForeignBinary) -> None:
    assert named(data) == expected


def test_a_pe_header_past_the_head_is_read_forward_from_a_stream() -> None:
    """A tar member is read forward only: the head, then at most the budget's bytes."""
    data = pe(0x8664, lfanew=0x3F0)
    rest = CountingFile(data[256:] + bytes(1 << 20))
    assert identify_stream(data[:256], rest) == ForeignBinary("windows", "PE", ("amd64",))
    assert rest.bytes_read <= 4096 + MAX_READ_BYTES


@pytest.mark.parametrize(
    ("word", "arch"),
    [
        (struct.pack("<I", 100 << 16 | 0o314), "386"),  # Linux QMAGIC, M_386
        (struct.pack("<I", 100 << 16 | 0o413), "386"),  # Linux ZMAGIC
        (struct.pack(">I", 134 << 16 | 0o413), "386"),  # NetBSD ZMAGIC, MID_I386
        (struct.pack(">I", 135 << 16 | 0o407), "m68k"),
    ],
)
def test_a_out_with_a_known_machine(word: bytes, arch: str) -> None:
    found = named(word + bytes(28))
    assert found == ForeignBinary("unix", "a.out", (arch,))
    assert found.detail() == f"a pre-ELF Unix {arch if arch != '386' else 'x86'} executable" \
        " (a.out): Linux runs ELF only: rebuild it"  # fmt: skip


@pytest.mark.parametrize(
    "data",
    [
        b"echo hello\n",
        b"",
        b"MZ" + bytes(100),  # an MZ with no PE header
        b"\xca\xfe\xba\xbe\x00\x00\x00\x34" + bytes(64),  # a Java class file (major 52)
        b"\xcf\xfa\xed\xfe" + struct.pack("<i", 99) + bytes(64),  # a Mach-O magic, no CPU
        struct.pack("<I", 0o407) + bytes(28),  # an a.out magic of no machine: two bytes only
        b"\x7fELF\x02\x01\x01" + bytes(100),
    ],
)
def test_what_is_no_other_os_executable(data: bytes) -> None:
    assert identify_file(io.BytesIO(data)) is None


@pytest.mark.parametrize(
    ("name", "desc", "osabi", "os"),
    [
        (b"NetBSD", struct.pack("<I", 1000000000), 0, "netbsd"),
        (b"OpenBSD", struct.pack("<I", 0), 0, "openbsd"),
        (b"FreeBSD", struct.pack("<I", 1400000), 0, "freebsd"),
        (b"GNU", struct.pack("<IIII", 3, 2, 6, 0), 0, "freebsd"),  # a GNU ABI tag: kFreeBSD
        (b"GNU", struct.pack("<IIII", 1, 0, 0, 0), 0, "hurd"),
        (b"GNU", struct.pack("<IIII", 0, 3, 2, 0), 0, "linux"),  # Linux's own tag
        (b"Go", b"buildid", 0, "linux"),  # another note: nothing said
        (b"Go", b"buildid", 9, "freebsd"),  # OS/ABI byte ELFOSABI_FREEBSD
    ],
)
def test_an_elf_names_its_os_by_os_abi_or_abi_note(
    name: bytes, desc: bytes, osabi: int, os: str
) -> None:
    info = read_elf(io.BytesIO(elf_with_note(name, desc, osabi=osabi)))
    assert info.platform is not None and info.platform.os == os
    other = of_elf(info)
    assert (other.os if other else "linux") == os


# --- the cause of a missing #! ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("head", "cause"),
    [
        (
            b"\xef\xbb\xbf#!/bin/sh\necho hi\n",
            "a UTF-8 byte order mark (EF BB BF) before #!: the kernel sees no #!"
            ' (first bytes: "\\xef\\xbb\\xbf#!/bin/sh\\necho hi\\n")',
        ),
        (
            b"\n#!/bin/sh\necho hi\n",
            "a blank first line before #!: #! must be the file's first two bytes"
            ' (first bytes: "\\n#!/bin/sh\\necho hi\\n")',
        ),
        (
            b"\r\n#!/bin/sh\r\necho hi\r\n",
            "a blank first line before #! (CRLF line endings): #! must be the file's first"
            ' two bytes (first bytes: "\\r\\n#!/bin/sh\\r\\necho hi\\r\\n")',
        ),
        (
            b"echo hi\r\nexit 0\r\n",
            "no #! interpreter line, and CRLF (Windows) line endings"
            ' (first bytes: "echo hi\\r\\nexit 0\\r\\n")',
        ),
        (b"echo hello\n", 'no #! interpreter line (first bytes: "echo hello\\n")'),
        (
            b"  #!/bin/sh\n",
            "spaces before #!: #! must be the file's first two bytes"
            ' (first bytes: "  #!/bin/sh\\n")',
        ),
        (
            b"\xff\xfe#\0!\0",
            "the file is UTF-16 (byte order mark): the kernel reads #! as"
            ' bytes (first bytes: "\\xff\\xfe#\\x00!\\x00")',
        ),
        (b"", 'the file is empty (first bytes: "")'),
        (
            b"#!   \n",
            "a #! line that names no interpreter (empty, or too long for the kernel)"
            ' (first bytes: "#!   \\n")',
        ),
    ],
)
def test_missing_shebang_cause_names_it_and_the_first_bytes_escaped(
    head: bytes, cause: str
) -> None:
    assert missing_shebang_cause(head) == cause


def test_the_cause_shows_at_most_32_bytes_and_no_control_character() -> None:
    cause = missing_shebang_cause(b'\x1b[31m"\\' + bytes(range(256)) * 64)
    shown = cause.partition("(first bytes: ")[2]
    assert shown.startswith('"\\x1b[31m\\"\\\\\\x00\\x01') and len(shown) < 32 * 4 + 4
    assert cause.isprintable()


# --- bounded work ------------------------------------------------------------------------------


def hostile(size: int) -> list[bytes]:
    """Each format's header claiming more than the file or the budget holds."""
    fat = struct.pack(">II", 0xCAFEBABE, 20) + struct.pack(">iiIII", 0x01000007, 3, 0, size, 0) * 20
    far_pe = bytearray(b"MZ" + bytes(62))
    struct.pack_into("<I", far_pe, 0x3C, size - 8)
    return [fat + bytes(size), bytes(far_pe) + bytes(size) + b"PE\0\0", b"\xcf\xfa\xed\xfe" * size]


@pytest.mark.parametrize("size", [1 << 10, 1 << 16, 1 << 20, 16 << 20])
def test_reads_stay_within_the_budget_whatever_the_size(size: int) -> None:
    for data in hostile(size):
        f = CountingFile(data)
        identify_file(f)
        assert f.bytes_read <= MAX_READS * MAX_READ_BYTES, (size, f.bytes_read)


def test_identify_asks_for_at_most_the_budgets_reads() -> None:
    asked: list[tuple[int, int]] = []

    def read(offset: int, length: int) -> bytes:
        asked.append((offset, length))
        return pe(0x8664, lfanew=0x800)[offset : offset + length]

    assert identify(read) == ForeignBinary("windows", "PE", ("amd64",))
    assert len(asked) <= MAX_READS and all(n <= MAX_READ_BYTES for _, n in asked)


def mutate(rng: random.Random, data: bytes) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 6)):
        pos = rng.randrange(min(len(buf), 1024))
        width = rng.choice([1, 2, 4])
        value = rng.choice([0, 1, 0x7F, 0xFF, 0xFFFF, 0xFFFFFFFF, rng.getrandbits(32)])
        buf[pos : pos + width] = (value % (1 << 8 * width)).to_bytes(width, "little")
    if rng.random() < 0.2:
        del buf[rng.randrange(1, len(buf)) :]
    return bytes(buf)


def test_mutated_headers_only_name_or_decline_within_the_budget(
    foreign_os: dict[str, Path],
) -> None:
    """Fixed seed: the first 8 KiB of the real files and the built ones, mutated 4,000
    times: a ForeignBinary or None, never an exception, never past the read budget."""
    rng = random.Random(20261207)
    seeds = [p.read_bytes()[:8192] for p in foreign_os.values()]
    seeds += [pe(0x8664), universal(seeds[0][:4096], seeds[1][:4096])[:8192]]
    seeds += [struct.pack("<I", 100 << 16 | 0o314) + bytes(60)]
    outcomes = {"named": 0, "declined": 0}
    start = time.perf_counter()
    for _ in range(4000):
        f = CountingFile(mutate(rng, rng.choice(seeds)))
        found = identify_file(f)
        outcomes["named" if found else "declined"] += 1
        assert f.bytes_read <= MAX_READS * MAX_READ_BYTES
        if found is not None:
            assert found.detail().isprintable()
    assert outcomes["named"] > 1000 and outcomes["declined"] > 100, outcomes
    assert time.perf_counter() - start < 10


def test_the_cause_of_any_bytes_is_one_bounded_printable_line() -> None:
    """Fixed seed: 2,000 random and mutated heads, up to 16 MiB: the cause reads only the
    kernel's 256 bytes, so its cost and length do not grow with the file."""
    rng = random.Random(38)
    seeds = [b"\xef\xbb\xbf#!/bin/sh\n", b"\r\n#!/bin/sh\r\n", b"echo hi\r\n", b"  #!x"]
    for _ in range(2000):
        head = mutate(rng, rng.choice(seeds) + rng.randbytes(rng.randrange(300)))
        cause = missing_shebang_cause(head)
        assert cause.isprintable() and "\n" not in cause and len(cause) < 300, cause
    big = b"\n" * (16 << 20)
    start = time.perf_counter()
    assert missing_shebang_cause(big).startswith("no #! interpreter line")
    assert time.perf_counter() - start < 0.05
