"""Build small, exact ELF files for tests: any machine, class, endianness and dynamic section.

Real binaries from Debian cover the common cases; this builder covers what no distribution
ships (x32, aarch64_be, loops in version tables, lying sizes) and lets a test state exactly
which DT_NEEDED, RUNPATH and symbol versions an object has.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

PT_LOAD, PT_DYNAMIC, PT_INTERP = 1, 2, 3
DT = {
    "NULL": 0,
    "NEEDED": 1,
    "STRTAB": 5,
    "STRSZ": 10,
    "SONAME": 14,
    "RPATH": 15,
    "RUNPATH": 29,
    "FLAGS_1": 0x6FFFFFFB,
    "VERDEF": 0x6FFFFFFC,
    "VERDEFNUM": 0x6FFFFFFD,
    "VERNEED": 0x6FFFFFFE,
    "VERNEEDNUM": 0x6FFFFFFF,
}
BASE_VADDR = 0x10000


def elf_hash(name: str) -> int:
    h = 0
    for c in name.encode():
        h = (h << 4) + c
        g = h & 0xF0000000
        if g:
            h ^= g >> 24
        h &= ~g
    return h & 0xFFFFFFFF


@dataclass
class ElfSpec:
    machine: int = 62
    elf_class: int = 2
    little: bool = True
    flags: int = 0
    elf_type: int = 3
    osabi: int = 0
    interpreter: str | None = "/lib64/ld-linux-x86-64.so.2"
    dynamic: bool = True
    needed: list[str] = field(default_factory=list)
    soname: str | None = None
    rpath: str | None = None
    runpath: str | None = None
    flags_1: int | None = None
    verneed: list[tuple[str, list[tuple[str, int]]]] = field(default_factory=list)
    verdef: list[str] = field(default_factory=list)
    arm_attributes: bytes | None = None


@dataclass
class BuiltElf:
    data: bytes
    offsets: dict[str, int]


class _Strings:
    def __init__(self) -> None:
        self.blob = bytearray(b"\0")

    def add(self, s: str) -> int:
        off = len(self.blob)
        self.blob += s.encode() + b"\0"
        return off


def build_elf(spec: ElfSpec) -> BuiltElf:
    e = "<" if spec.little else ">"
    is64 = spec.elf_class == 2
    ehdr_size, phdr_size, dyn_fmt = (64, 56, "qQ") if is64 else (52, 32, "iI")
    phdrs: list[tuple[int, int, int]] = []  # (type, offset, size)
    offsets: dict[str, int] = {}
    body = bytearray()

    n_phdr = 1 + (spec.interpreter is not None) + spec.dynamic
    cursor = ehdr_size + n_phdr * phdr_size

    def place(name: str, blob: bytes, align: int = 8) -> int:
        nonlocal cursor
        pad = (-cursor) % align
        body.extend(b"\0" * pad)
        cursor += pad
        offsets[name] = cursor
        body.extend(blob)
        cursor += len(blob)
        return offsets[name]

    if spec.interpreter is not None:
        interp = spec.interpreter.encode() + b"\0"
        phdrs.append((PT_INTERP, place("interp", interp, 1), len(interp)))

    dyn: list[tuple[int, int]] = []
    if spec.dynamic:
        strings = _Strings()
        dyn += [(DT["NEEDED"], strings.add(n)) for n in spec.needed]
        if spec.soname is not None:
            dyn.append((DT["SONAME"], strings.add(spec.soname)))
        if spec.rpath is not None:
            dyn.append((DT["RPATH"], strings.add(spec.rpath)))
        if spec.runpath is not None:
            dyn.append((DT["RUNPATH"], strings.add(spec.runpath)))
        verneed = bytearray()
        for i, (file, versions) in enumerate(spec.verneed):
            last = i == len(spec.verneed) - 1
            need_next = 0 if last else 16 + 16 * len(versions)
            verneed += struct.pack(
                e + "HHIII", 1, len(versions), strings.add(file), 16 if versions else 0, need_next
            )
            for j, (name, vflags) in enumerate(versions):
                aux_next = 0 if j == len(versions) - 1 else 16
                verneed += struct.pack(
                    e + "IHHII", elf_hash(name), vflags, 2 + j, strings.add(name), aux_next
                )
        verdef = bytearray()
        for i, name in enumerate(spec.verdef):
            last = i == len(spec.verdef) - 1
            verdef += struct.pack(
                e + "HHHHIII",
                1,
                1 if i == 0 else 0,
                i + 1,
                1,
                elf_hash(name),
                20,
                0 if last else 28,
            )
            verdef += struct.pack(e + "II", strings.add(name), 0)
        strtab = place("dynstr", bytes(strings.blob), 1)
        dyn += [(DT["STRTAB"], BASE_VADDR + strtab), (DT["STRSZ"], len(strings.blob))]
        if verneed:
            off = place("verneed", bytes(verneed), 4)
            dyn += [(DT["VERNEED"], BASE_VADDR + off), (DT["VERNEEDNUM"], len(spec.verneed))]
        if verdef:
            off = place("verdef", bytes(verdef), 4)
            dyn += [(DT["VERDEF"], BASE_VADDR + off), (DT["VERDEFNUM"], len(spec.verdef))]
        if spec.flags_1 is not None:
            dyn.append((DT["FLAGS_1"], spec.flags_1))
        dyn.append((DT["NULL"], 0))
        blob = b"".join(struct.pack(e + dyn_fmt, t, v) for t, v in dyn)
        phdrs.append((PT_DYNAMIC, place("dynamic", blob), len(blob)))

    shoff = shnum = 0
    if spec.arm_attributes is not None:
        attrs = place("arm_attributes", spec.arm_attributes, 1)
        shdr_fmt = e + ("IIQQQQIIQQ" if is64 else "IIIIIIIIII")
        table = struct.pack(shdr_fmt, *([0] * 10))
        table += struct.pack(
            shdr_fmt, 0, 0x70000003, 0, 0, attrs, len(spec.arm_attributes), 0, 0, 1, 0
        )
        shoff, shnum = place("shdrs", table), 2

    total = cursor
    phdrs.insert(0, (PT_LOAD, 0, total))
    ident = b"\x7fELF" + bytes([spec.elf_class, 1 if spec.little else 2, 1, spec.osabi]) + bytes(8)
    if is64:
        ehdr = struct.pack(
            e + "16sHHIQQQIHHHHHH", ident, spec.elf_type, spec.machine, 1, 0, ehdr_size, shoff,
            spec.flags, ehdr_size, phdr_size, len(phdrs), 64, shnum, 0,
        )  # fmt: skip
    else:
        ehdr = struct.pack(
            e + "16sHHIIIIIHHHHHH", ident, spec.elf_type, spec.machine, 1, 0, ehdr_size, shoff,
            spec.flags, ehdr_size, phdr_size, len(phdrs), 40, shnum, 0,
        )  # fmt: skip
    phdr_table = bytearray()
    offsets["phdrs"] = ehdr_size
    for kind, off, size in phdrs:
        vaddr = BASE_VADDR + off
        if is64:
            phdr_table += struct.pack(e + "IIQQQQQQ", kind, 4, off, vaddr, vaddr, size, size, 8)
        else:
            phdr_table += struct.pack(e + "IIIIIIII", kind, off, vaddr, vaddr, size, size, 4, 4)
    return BuiltElf(ehdr + bytes(phdr_table) + bytes(body), offsets)


def arm_attributes(cpu_arch: int, little: bool = True) -> bytes:
    """A `.ARM.attributes` section with Tag_CPU_name "test" and Tag_CPU_arch = cpu_arch."""
    order = "<" if little else ">"
    attrs = b"\x05test\0" + bytes([6, cpu_arch]) + bytes([10, 2])  # CPU_name, CPU_arch, FP_arch
    file_sub = bytes([1]) + struct.pack(order + "I", 5 + len(attrs)) + attrs
    vendor = b"aeabi\0" + file_sub
    return b"A" + struct.pack(order + "I", 4 + len(vendor)) + vendor
