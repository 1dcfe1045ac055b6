"""x86-64 ISA levels: GNU_PROPERTY_X86_ISA_1_NEEDED as glibc's loader reads it, and the CPU's
levels as glibc-hwcaps defines them.

The oracles are real: binaries built here by gcc/ld with `-z x86-64-vN` and Debian's own
binaries (which carry an "x86-64-baseline" note), read back by binutils' `readelf`; the
host's levels against what its ld.so (`--help`) says it supports; and, for hostile notes,
what `sysdeps/x86/dl-prop.h` does with each.
"""

from __future__ import annotations

import io
import re
import struct
import subprocess
from pathlib import Path

import pytest

from execwatch.binfmt import read_elf
from execwatch.binfmt.isa import (
    BASELINE,
    GNU_PROPERTY_X86_ISA_1_NEEDED,
    MAX_CPUINFO_BYTES,
    NT_GNU_PROPERTY_TYPE_0,
    V2,
    V3,
    V4,
    cpu_levels,
    first_shortfall,
    lacking,
    level_name,
    parse_isa_needed,
    parse_level,
    platform_levels,
    read_cpu_levels,
)
from execwatch.binfmt.platform import Platform
from tests.support.binfmt.cbuild import HELLO_C, compile_c
from tests.support.binfmt.hostile_elf import measure

README_LEVEL = re.compile(r"x86 ISA needed: (.*)$", re.MULTILINE)
FEATURE_1_AND = 0xC0000002


def readelf_levels(path: Path) -> set[str]:
    """binutils' reading of the note: {'x86-64-baseline', 'x86-64-v3'}."""
    text = subprocess.run(["readelf", "-nW", str(path)], capture_output=True, text=True).stdout
    found = README_LEVEL.search(text)
    return set(found[1].split(", ")) if found else set()


def names(bits: int) -> set[str]:
    return {level_name(b) for b in (BASELINE, V2, V3, V4) if bits & b}


def needed_of(path: Path) -> int:
    with path.open("rb") as f:
        return read_elf(f).x86_isa_needed


# `-z x86-64-baseline` makes binutils 2.40 abort (elfxx-x86.c:3835); Debian's own binaries
# below carry that level.
@pytest.mark.parametrize("level", ["x86-64-v2", "x86-64-v3", "x86-64-v4"])
def test_built_binaries_read_as_binutils_reads_them(tmp_path: Path, level: str) -> None:
    exe = compile_c(tmp_path / "exe", HELLO_C, "gcc", f"-Wl,-z,{level}")
    lib = compile_c(tmp_path / "lib.so", "int f(void){return 1;}\n", "gcc", "-shared",
                    "-fPIC", f"-Wl,-z,{level}")  # fmt: skip
    for path in (exe, lib):
        assert level in readelf_levels(path)
        assert names(needed_of(path)) == readelf_levels(path)


@pytest.mark.parametrize(
    "path", ["/usr/bin/ls", "/usr/bin/python3", "/lib/x86_64-linux-gnu/libc.so.6"]
)
def test_debian_binaries_need_the_baseline(path: str) -> None:
    assert names(needed_of(Path(path))) == readelf_levels(Path(path)) == {"x86-64-baseline"}


def test_an_unknown_property_needs_nothing(tmp_path: Path) -> None:
    exe = compile_c(tmp_path / "exe", HELLO_C, "gcc", "-Wl,-z,noexecstack")
    data = bytearray(exe.read_bytes())
    data[data.index(b"GNU\0\x02\x80\x00\xc0") + 4] = 0x7F  # rename the property: unknown type
    assert read_elf(io.BytesIO(bytes(data))).x86_isa_needed == 0


def test_the_host_runs_what_its_levels_allow(tmp_path: Path) -> None:
    """Our verdict against the real loader's, for every level, on whatever CPU this is."""
    have = read_cpu_levels()
    assert have is not None and have & BASELINE
    for level in ("x86-64-v2", "x86-64-v3", "x86-64-v4"):
        exe = compile_c(tmp_path / level, HELLO_C, "gcc", f"-Wl,-z,{level}")
        done = subprocess.run([str(exe)], capture_output=True, text=True)
        if lacking(needed_of(exe), have):
            assert done.returncode == 127 and "CPU ISA level is lower" in done.stderr, done
        else:
            assert done.returncode == 0, done


def test_the_host_levels_are_the_ones_its_loader_supports() -> None:
    text = subprocess.run(["/lib64/ld-linux-x86-64.so.2", "--help"], capture_output=True,
                          text=True).stdout  # fmt: skip
    supported = set(re.findall(r"^\s+(x86-64-v\d) \(supported", text, re.MULTILINE))
    assert supported == names(read_cpu_levels() or 0) - {"x86-64-baseline"}


def test_cpu_levels_need_every_flag_of_each_level() -> None:
    v3 = "cmov cx8 fpu fxsr mmx sse sse2 cx16 lahf_lm popcnt pni ssse3 sse4_1 sse4_2"
    v3 += " avx avx2 bmi1 bmi2 f16c fma abm movbe"
    assert cpu_levels(frozenset(v3.split())) == BASELINE | V2 | V3
    assert cpu_levels(frozenset(v3.replace(" abm", "").split())) == BASELINE | V2
    v4_but_vl = v3 + " avx512f avx512bw avx512cd avx512dq"
    assert cpu_levels(frozenset(v4_but_vl.split())) == BASELINE | V2 | V3
    assert cpu_levels(frozenset((v4_but_vl + " avx512vl").split())) == 0b1111
    # A level without the ones below it does not count (glibc nests the tests).
    only_v3 = v3.split()[14:]
    assert only_v3[0] == "avx" and cpu_levels(frozenset(only_v3)) == 0


def test_cpuinfo_is_read_bounded(tmp_path: Path) -> None:
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd evtstrm aes\n")
    assert read_cpu_levels(str(arm)) is None
    assert read_cpu_levels(str(tmp_path / "absent")) is None
    flood = tmp_path / "flood"  # 64 MiB of one line: read up to the bound, then given up
    with flood.open("wb") as f:
        f.write(b"x" * (64 << 20) + b"\nflags : cmov cx8 fpu fxsr mmx sse sse2\n")
    outcome, cost = measure(lambda: read_cpu_levels(str(flood)), repeat=1)
    assert outcome is None
    assert cost.peak_bytes < 4 * MAX_CPUINFO_BYTES and cost.seconds < 0.25
    ok = tmp_path / "ok"
    ok.write_text("processor : 0\nflags : cmov cx8 fpu fxsr mmx sse sse2 cx16\n\nflags : x\n")
    assert read_cpu_levels(str(ok)) == BASELINE  # the first processor's line


def test_levels_by_name_and_by_platform() -> None:
    assert parse_level("x86-64-v3") == parse_level("v3") == parse_level("3") == 0b0111
    assert parse_level("baseline") == parse_level("x86-64-v1") == BASELINE
    with pytest.raises(ValueError, match="invalid x86-64 level"):
        parse_level("v5")
    assert platform_levels(Platform.parse("linux/amd64")) == BASELINE
    assert platform_levels(Platform.parse("linux/amd64/v3")) == 0b0111
    assert platform_levels(Platform.parse("linux/arm64")) is None


def test_the_first_shortfall_is_in_the_loaders_order() -> None:
    """ld.so checks from the last dependency back to the program; ld.so itself is not listed."""
    objects = [("/app", V2), ("/lib/a.so", V3 | BASELINE), ("/lib/b.so", V4)]
    short = first_shortfall(objects, 0b0011)
    assert short is not None and (short.path, short.required) == ("/lib/b.so", "x86-64-v4")
    short = first_shortfall(objects[:2], 0b0011)
    assert short is not None and (short.path, short.required, short.has) == (
        "/lib/a.so", "x86-64-v3", "x86-64-v2",
    )  # fmt: skip
    assert first_shortfall(objects, 0b1111) is None


# --- hostile notes: each one as ld.so treats it --------------------------------------------


def note(desc: bytes, *, name: bytes = b"GNU\0", kind: int = NT_GNU_PROPERTY_TYPE_0,
         descsz: int | None = None) -> bytes:  # fmt: skip
    head = struct.pack("<III", len(name), len(desc) if descsz is None else descsz, kind)
    body = head + name + b"\0" * (-(12 + len(name)) % 8) + desc
    return body + b"\0" * (-len(body) % 8)


def prop(kind: int, value: bytes) -> bytes:
    return struct.pack("<II", kind, len(value)) + value + b"\0" * (-len(value) % 8)


V3_PROP = prop(GNU_PROPERTY_X86_ISA_1_NEEDED, struct.pack("<I", V3 | BASELINE))


FEATURES = prop(FEATURE_1_AND, b"\3\0\0\0")
HOSTILE_NOTES: dict[str, tuple[bytes, int | None]] = {
    "v3": (note(V3_PROP), V3 | BASELINE),
    "after-another-property": (note(FEATURES + V3_PROP), V3 | BASELINE),
    "after-another-name": (note(b"x" * 8, name=b"GNU2\0") + note(V3_PROP), V3 | BASELINE),
    "then-more-properties": (note(V3_PROP + FEATURES), V3 | BASELINE),  # ld.so stops at it
    "empty": (b"", None),
    "build-id-like": (note(b"abcd" * 2, kind=3), None),  # not a property note: look further
    "two-property-notes": (note(V3_PROP) + note(V3_PROP), 0),  # an old linker's: ignored
    "unsorted": (note(prop(FEATURE_1_AND + 0x10000000, b"\1\0\0\0") + V3_PROP), 0),
    "size-8": (note(prop(GNU_PROPERTY_X86_ISA_1_NEEDED, bytes(8))), 0),
    "descsz-12": (note(V3_PROP, descsz=12), 0),  # not a multiple of 8
    "descsz-past-the-segment": (note(V3_PROP, descsz=0xFFFFFFF8), 0),
    "datasz-past-the-note": (
        note(struct.pack("<II", GNU_PROPERTY_X86_ISA_1_NEEDED, 0xFFFFFFF0) + bytes(8)),
        0,
    ),
    "namesz-huge": (struct.pack("<III", 0xFFFFFFFF, 0xFFFFFFFF, 5) + b"GNU\0", None),
    "truncated-properties": (note(V3_PROP)[:20], 0),
}


@pytest.mark.parametrize("name", HOSTILE_NOTES)
def test_hostile_notes(name: str) -> None:
    data, expected = HOSTILE_NOTES[name]
    assert parse_isa_needed(data, True, 64) == expected


def test_a_note_flood_is_bounded() -> None:
    """4 KiB of one-property notes is the most one segment gives the parser."""
    flood = b"".join(note(b"abcdefgh", kind=1) for _ in range(128))
    outcome, cost = measure(lambda: parse_isa_needed(flood, True, 64))
    assert outcome is None
    assert cost.seconds < 0.25 and cost.peak_bytes < 1 << 20


def test_big_endian_and_32_bit_notes() -> None:
    desc = struct.pack(">II", GNU_PROPERTY_X86_ISA_1_NEEDED, 4) + struct.pack(">I", V2)
    head = struct.pack(">III", 4, len(desc), NT_GNU_PROPERTY_TYPE_0) + b"GNU\0"
    assert parse_isa_needed(head + desc, False, 32) == V2
    assert parse_isa_needed(head + desc, False, 64) == 0  # 12 bytes: not 8-aligned for ELF64
