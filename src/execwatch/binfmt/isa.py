"""x86-64 ISA levels: what a binary needs (GNU_PROPERTY_X86_ISA_1_NEEDED) and what a CPU has.

glibc 2.33 and later read the needed levels from each object's NT_GNU_PROPERTY_TYPE_0
note and refuse to start a program when the CPU lacks one ("CPU ISA level is lower than
required", exit 127 from ld.so; `sysdeps/x86/dl-prop.h`). The CPU's levels are the
glibc-hwcaps ones (`sysdeps/x86/get-isa-level.h`), here from /proc/cpuinfo's flags.

Levels are bit sets, as in the note: BASELINE=1, V2=2, V3=4, V4=8. A CPU has every level
up to its highest; a binary needs every bit it sets.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from execwatch.binfmt.platform import Platform

NT_GNU_PROPERTY_TYPE_0 = 5
GNU_PROPERTY_X86_ISA_1_NEEDED = 0xC0008002
MAX_NOTE_BYTES = 4096  # one PT_NOTE read; a real .note.gnu.property is 32-64 bytes
MAX_CPUINFO_BYTES = 256 << 10  # the first processor's block is ~1.5 KiB

BASELINE, V2, V3, V4 = 1, 2, 4, 8
NAMES = {BASELINE: "x86-64-baseline", V2: "x86-64-v2", V3: "x86-64-v3", V4: "x86-64-v4"}

# /proc/cpuinfo spellings of glibc's feature tests: pni is SSE3, abm is LZCNT. The kernel
# drops the AVX flags when the OS does not enable XSAVE, as glibc's "usable" does.
LEVEL_FLAGS: tuple[tuple[int, frozenset[str]], ...] = (
    (BASELINE, frozenset({"cmov", "cx8", "fpu", "fxsr", "mmx", "sse", "sse2"})),
    (V2, frozenset({"cx16", "lahf_lm", "popcnt", "pni", "ssse3", "sse4_1", "sse4_2"})),
    (V3, frozenset({"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe"})),
    (V4, frozenset({"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"})),
)


def level_name(bits: int) -> str:
    """The highest level in `bits` (x86-64-v3), or the raw bits when none is known."""
    for bit in (V4, V3, V2, BASELINE):
        if bits & bit:
            return NAMES[bit]
    return f"x86 ISA bits {bits:#x}"


def parse_level(text: str) -> int:
    """`x86-64-v3`, `v3` or `3` (and `baseline`/`v1`) as the bits a CPU of that level has."""
    word = text.strip().lower().removeprefix("x86-64-").removeprefix("x86_64-")
    word = {"baseline": "v1", "1": "v1", "2": "v2", "3": "v3", "4": "v4"}.get(word, word)
    levels = {"v1": BASELINE, "v2": V2, "v3": V3, "v4": V4}
    if word not in levels:
        raise ValueError(f"invalid x86-64 level {text!r}: expected x86-64-v1 ... x86-64-v4")
    return cumulative(levels[word])


def cumulative(bit: int) -> int:
    """A CPU at level `bit` has every level below it."""
    return (bit << 1) - 1


def lacking(needed: int, available: int) -> int:
    """The needed bits the CPU lacks (0: it runs), as `dl_isa_level_check` tests them."""
    return needed & ~available


def cpu_levels(flags: frozenset[str] | set[str]) -> int:
    """The levels of a CPU with these /proc/cpuinfo flags: each needs all the ones below."""
    bits = 0
    for bit, required in LEVEL_FLAGS:
        if not required <= flags:
            break
        bits |= bit
    return bits


def read_cpu_levels(path: str = "/proc/cpuinfo") -> int | None:
    """This machine's levels from the first `flags` line; None when it has none (not x86)."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_CPUINFO_BYTES)
    except OSError:
        return None
    for line in data.split(b"\n"):
        key, sep, value = line.partition(b":")
        if sep and key.strip() == b"flags":
            return cpu_levels(frozenset(value.decode("ascii", "replace").split()))
    return None


def platform_levels(platform: Platform) -> int | None:
    """What an OCI platform promises: amd64 is the baseline, amd64/v3 has v3 (image-spec)."""
    if platform.architecture != "amd64":
        return None
    return parse_level(platform.variant or "v1")


@dataclass(frozen=True)
class Shortfall:
    """An object that needs a level the CPU lacks."""

    path: str
    needed: int
    available: int

    @property
    def required(self) -> str:
        return level_name(lacking(self.needed, self.available))

    @property
    def has(self) -> str:
        return level_name(self.available) if self.available else "no x86-64 level"


def first_shortfall(objects: list[tuple[str, int]], available: int) -> Shortfall | None:
    """The first object (path, needed bits) the CPU cannot run, in ld.so's order: it checks
    the search list from its last dependency back to the program."""
    for path, needed in reversed(objects):
        if lacking(needed, available):
            return Shortfall(path, needed, available)
    return None


def parse_isa_needed(data: bytes, little: bool, bits: int) -> int | None:
    """GNU_PROPERTY_X86_ISA_1_NEEDED from the notes of one PT_NOTE segment, as ld.so reads it.

    None when the segment holds no NT_GNU_PROPERTY_TYPE_0 note (ld.so looks at the next
    one); 0 when the note is there but says nothing usable: malformed, unsorted, a size
    other than 4, or a second GNU property note (what ld.so does with each of these). Only
    the first MAX_NOTE_BYTES are looked at, as the ELF reader reads no more of a segment.
    """
    data = data[:MAX_NOTE_BYTES]  # ELF readers pass at most this; the loop is bounded by it
    order = "<" if little else ">"
    align = 8 if bits == 64 else 4
    header = struct.Struct(order + "III")
    pos, found = 0, None
    while pos + header.size <= len(data):
        namesz, descsz, kind = header.unpack_from(data, pos)
        name_at = pos + header.size
        desc_at = pos + _up(header.size + namesz, align)  # ELF_NOTE_DESC_OFFSET
        if namesz == 4 and kind == NT_GNU_PROPERTY_TYPE_0 and data[name_at:desc_at] == b"GNU\0":
            if found is not None:
                return 0  # two GNU property notes: an old linker's, trusted by neither
            found = _properties(data[desc_at : desc_at + descsz], descsz, order, align)
        pos = _up(desc_at + descsz, align)  # ELF_NOTE_NEXT_OFFSET
    return found


def _properties(desc: bytes, descsz: int, order: str, align: int) -> int:
    if descsz < 8 or descsz % align or len(desc) < descsz:
        return 0
    pos, last = 0, 0
    while len(desc) - pos >= 8:
        kind, size = struct.unpack_from(order + "II", desc, pos)
        pos += 8
        if kind < last or pos + size > len(desc):
            return 0
        last = kind
        if kind == GNU_PROPERTY_X86_ISA_1_NEEDED:
            if size != 4:
                return 0
            value: int = struct.unpack_from(order + "I", desc, pos)[0]
            return value
        if kind > GNU_PROPERTY_X86_ISA_1_NEEDED:
            return 0
        pos += _up(size, align)
    return 0


def _up(value: int, align: int) -> int:
    return (value + align - 1) & ~(align - 1)
