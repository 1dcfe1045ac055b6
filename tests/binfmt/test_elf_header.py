"""read_elf's own ELF header and program header parse, with pyelftools as the oracle: every
ELF file of Debian's packages for seven architectures (both classes, both byte orders) and
the host's binaries, and the gABI numbers the reader uses instead of importing pyelftools."""

from __future__ import annotations

from pathlib import Path

from elftools.elf.elffile import ELFFile
from elftools.elf.enums import ENUM_D_TAG_COMMON, ENUM_E_MACHINE, ENUM_E_TYPE, ENUM_P_TYPE_BASE
from elftools.elf.segments import InterpSegment

from execwatch.binfmt import elf
from execwatch.binfmt.elf import read_elf


def test_the_constants_are_the_gabi_numbers_pyelftools_knows() -> None:
    assert {tag: elf.DT[tag] for tag in elf.DT} == {
        tag: ENUM_D_TAG_COMMON[f"DT_{tag}"] for tag in elf.DT
    }
    for name in ("PT_LOAD", "PT_DYNAMIC", "PT_INTERP", "PT_NOTE"):
        assert getattr(elf, name) == ENUM_P_TYPE_BASE[name]


def elf_files(foreign_root: Path, host_binaries: dict[str, Path]) -> list[Path]:
    found = [p for p in foreign_root.rglob("*") if p.is_file() and not p.is_symlink()]
    found = [p for p in found if p.open("rb").read(4) == elf.ELF_MAGIC]
    return sorted(found) + sorted(host_binaries.values())


def test_header_fields_equal_pyelftools_on_real_files(
    foreign_root: Path, host_binaries: dict[str, Path]
) -> None:
    files = elf_files(foreign_root, host_binaries)
    classes = set()
    for path in files:
        with path.open("rb") as f:
            info = read_elf(f)
            oracle = ELFFile(f)
            header = oracle.header
            want_machine = ENUM_E_MACHINE.get(header["e_machine"], header["e_machine"])
            want_type = ENUM_E_TYPE.get(header["e_type"], header["e_type"])
            assert (info.machine, info.elf_type, info.flags) == (
                want_machine,
                want_type,
                header["e_flags"],
            ), path
            assert (info.bits, info.little_endian) == (oracle.elfclass, oracle.little_endian)
            interp = [s for s in oracle.iter_segments() if isinstance(s, InterpSegment)]
            assert info.interpreter == (interp[0].get_interp_name() if interp else None), path
            assert info.has_dynamic == any(
                s["p_type"] == "PT_DYNAMIC" for s in oracle.iter_segments()
            ), path
            classes.add((info.bits, info.little_endian))
    assert len(files) >= 30
    assert classes == {(32, True), (64, True), (64, False)}  # s390x is the big-endian one
