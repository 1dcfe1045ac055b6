"""read_elf on exact, hand-built headers: labels without OCI names, arm variants, hostility."""

from __future__ import annotations

import io
import struct

import pytest

from execwatch.binfmt import BinfmtError, ElfInfo, Platform, read_elf
from tests.support.binfmt.elfbuild import DT, ElfSpec, arm_attributes, build_elf


def parse(data: bytes) -> ElfInfo:
    return read_elf(io.BytesIO(data))


def header_only(machine: int, elf_class: int, little: bool, flags: int = 0) -> ElfInfo:
    spec = ElfSpec(machine=machine, elf_class=elf_class, little=little, flags=flags)
    spec.interpreter, spec.dynamic = None, False
    return parse(build_elf(spec).data)


@pytest.mark.parametrize(
    ("machine", "elf_class", "little", "flags", "arch", "platform"),
    [
        (62, 2, True, 0, "amd64", "linux/amd64"),
        (62, 1, True, 0, "x32", None),
        (3, 1, True, 0, "386", "linux/386"),
        (183, 2, True, 0, "arm64", "linux/arm64"),
        (183, 2, False, 0, "aarch64_be", None),
        (21, 2, True, 2, "ppc64le", "linux/ppc64le"),
        (21, 2, False, 1, "ppc64", "linux/ppc64"),
        (22, 2, False, 0, "s390x", "linux/s390x"),
        (22, 1, False, 0, "s390 (31-bit)", None),
        (243, 2, True, 4, "riscv64", "linux/riscv64"),
        (8, 2, True, 0, "mips64le", "linux/mips64le"),
        (8, 2, False, 0, "mips64", "linux/mips64"),
        (8, 1, True, 0x20, "mips64 n32le", None),
        (8, 1, True, 0, "mipsle", "linux/mipsle"),
        (258, 2, True, 0x40, "loong64", "linux/loong64"),
        (4242, 2, True, 0, "unknown-machine-4242", None),
    ],
)
def test_machine_class_and_endianness_name_the_architecture(
    machine: int, elf_class: int, little: bool, flags: int, arch: str, platform: str | None
) -> None:
    info = header_only(machine, elf_class, little, flags)
    assert info.arch == arch
    assert (None if info.platform is None else str(info.platform)) == platform
    assert (info.machine, info.elf_class, info.little_endian) == (machine, elf_class, little)


@pytest.mark.parametrize(
    ("cpu_arch", "variant"), [(4, "v5"), (5, "v5"), (6, "v6"), (9, "v6"), (10, "v7"), (14, "v8")]
)
def test_arm_variant_comes_from_tag_cpu_arch(cpu_arch: int, variant: str) -> None:
    spec = ElfSpec(machine=40, elf_class=1, flags=0x05000400, interpreter=None, dynamic=False)
    spec.arm_attributes = arm_attributes(cpu_arch)
    info = parse(build_elf(spec).data)
    assert info.platform == Platform("linux", "arm", variant)
    assert info.float_abi == "hard"


def test_arm_without_attributes_has_no_variant_like_go_binaries() -> None:
    spec = ElfSpec(machine=40, elf_class=1, flags=0x05000000, interpreter=None, dynamic=False)
    info = parse(build_elf(spec).data)
    assert info.platform == Platform("linux", "arm", None)
    assert info.float_abi is None


def test_damaged_arm_attributes_lose_only_the_variant() -> None:
    spec = ElfSpec(machine=40, elf_class=1, flags=0x05000200, interpreter=None, dynamic=False)
    spec.arm_attributes = b"A\xff\xff\xff\x7faeabi"
    info = parse(build_elf(spec).data)
    assert info.platform == Platform("linux", "arm", None) and info.float_abi == "soft"


def test_big_endian_dynamic_object_with_versions_and_runpath() -> None:
    spec = ElfSpec(
        machine=22, little=False, interpreter="/lib/ld64.so.1", needed=["libz.so.1", "libc.so.6"],
        runpath="$ORIGIN/../lib", rpath="/ignored", soname="libx.so.1", flags_1=0,
        verneed=[("libc.so.6", [("GLIBC_2.34", 0), ("GLIBC_2.99", 2)])],
        verdef=["libx.so.1", "X_1.0"],
    )  # fmt: skip
    info = parse(build_elf(spec).data)
    assert info.platform == Platform("linux", "s390x")
    assert info.needed == ("libz.so.1", "libc.so.6")
    assert info.runpath == ("$ORIGIN/../lib",) and info.rpath == ("/ignored",)
    assert info.soname == "libx.so.1"
    assert info.version_defs == {"libx.so.1", "X_1.0"}
    (need,) = info.version_needs
    assert [(v.name, v.weak) for v in need.versions] == [
        ("GLIBC_2.34", False),
        ("GLIBC_2.99", True),
    ]


def test_freebsd_osabi_is_not_linux() -> None:
    spec = ElfSpec(osabi=9, interpreter=None, dynamic=False)
    assert parse(build_elf(spec).data).platform == Platform("freebsd", "amd64")


# --- hostile and broken input: always BinfmtError with a one-line message -------------------


def valid() -> bytes:
    return build_elf(
        ElfSpec(needed=["libc.so.6"], verneed=[("libc.so.6", [("GLIBC_2.2.5", 0)])])
    ).data


def patched(data: bytes, offset: int, fmt: str, *values: int) -> bytes:
    buf = bytearray(data)
    struct.pack_into(fmt, buf, offset, *values)
    return bytes(buf)


def dyn_entry_offset(spec: ElfSpec, tag: str) -> int:
    built = build_elf(spec)
    raw = built.data[built.offsets["dynamic"] :]
    for i in range(0, len(raw), 16):
        if struct.unpack_from("<q", raw, i)[0] == DT[tag]:
            return built.offsets["dynamic"] + i
    raise AssertionError(tag)


HOSTILE = {
    "empty": (b"", "truncated ELF header"),
    "three bytes": (b"\x7fEL", "truncated ELF header"),
    "magic only": (b"\x7fELF", "truncated ELF header"),
    "not ELF": (b"#!/bin/sh\n" + bytes(60), "not an ELF file"),
    "bad class": (b"\x7fELF\x03\x01\x01" + bytes(57), "invalid ELF class 3"),
    "bad data": (b"\x7fELF\x02\x07\x01" + bytes(57), "invalid ELF data encoding 7"),
    "ident only": (b"\x7fELF\x02\x01\x01" + bytes(9), "truncated ELF header"),
    "truncated ehdr": (valid()[:40], "truncated ELF header"),
    "phdrs cut off": (valid()[:100], "program header table outside the file"),
    "phentsize lies": (patched(valid(), 54, "<H", 40), "program header entry size 40, expected 56"),
    "phoff huge": (patched(valid(), 32, "<Q", 2**63), "program header table outside the file"),
    "phnum huge": (patched(valid(), 56, "<H", 0xFFFF), "program header table too large"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_broken_headers_raise_binfmt_error_with_one_line(name: str) -> None:
    data, message = HOSTILE[name]
    with pytest.raises(BinfmtError) as caught:
        parse(data)
    assert str(caught.value) == message
    assert "\n" not in str(caught.value)


def test_interp_without_nul_is_refused_like_the_kernel() -> None:
    built = build_elf(ElfSpec())
    data = bytearray(built.data)
    end = built.data.index(b"\0", built.offsets["interp"])
    data[end] = ord("x")
    with pytest.raises(BinfmtError, match="PT_INTERP is not NUL-terminated"):
        parse(bytes(data))


def test_interp_larger_than_path_max_is_refused() -> None:
    with pytest.raises(BinfmtError, match="PT_INTERP of 5000 bytes"):
        parse(build_elf(ElfSpec(interpreter="/" + "x" * 4998)).data)


def test_string_index_outside_the_table() -> None:
    spec = ElfSpec(needed=["libc.so.6"])
    data = patched(build_elf(spec).data, dyn_entry_offset(spec, "NEEDED") + 8, "<Q", 10**9)
    with pytest.raises(BinfmtError, match="string index outside"):
        parse(data)


def test_strtab_outside_every_load_segment() -> None:
    spec = ElfSpec(needed=["libc.so.6"])
    data = patched(build_elf(spec).data, dyn_entry_offset(spec, "STRTAB") + 8, "<Q", 0xDEAD0000)
    with pytest.raises(BinfmtError, match="not in any PT_LOAD segment"):
        parse(data)


def test_self_referencing_version_chain_is_bounded() -> None:
    spec = ElfSpec(needed=["libc.so.6"], verneed=[("libc.so.6", [("GLIBC_2.2.5", 0)])])
    built = build_elf(spec)
    data = bytearray(built.data)
    vn = built.offsets["verneed"]
    struct.pack_into("<I", data, vn + 12, 0x10)  # vn_next: jump to the aux entry...
    struct.pack_into("<IHHII", data, vn + 16, 0, 0, 0, 0, 0xFFFFFFF0)  # ...which jumps back
    count_at = dyn_entry_offset(spec, "VERNEEDNUM") + 8
    struct.pack_into("<Q", data, count_at, 2**40)
    with pytest.raises(BinfmtError):
        parse(bytes(data))


def test_verneed_cycle_with_zero_step_stops() -> None:
    spec = ElfSpec(needed=["libc.so.6"], verneed=[("libc.so.6", [("GLIBC_2.2.5", 0)])])
    data = patched(build_elf(spec).data, dyn_entry_offset(spec, "VERNEEDNUM") + 8, "<Q", 2**40)
    info = parse(data)  # vn_next == 0 ends the chain whatever the count says
    assert [n.file for n in info.version_needs] == ["libc.so.6"]


def test_dynamic_size_lie_is_clamped_to_the_file() -> None:
    built = build_elf(ElfSpec(needed=["libc.so.6"]))
    dynamic_phdr = 64 + 2 * 56  # PT_LOAD, PT_INTERP, PT_DYNAMIC
    data = patched(built.data, dynamic_phdr + 32, "<Q", 2**62)  # p_filesz
    assert parse(data).needed == ("libc.so.6",)
