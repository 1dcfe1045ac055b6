"""The missing-symbol check's reader: imports decoded, exports looked up by hash.

pyelftools is the oracle: every defined global symbol of real libraries, with and without
its version, must be found through .gnu.hash (or .hash, or, without either, the decoded
export set), and names or versions a library lacks must not.
"""

from __future__ import annotations

import io
import struct
import subprocess
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerDefSection, GNUVerNeedSection, GNUVerSymSection
from elftools.elf.sections import SymbolTableSection

from execwatch.binfmt import read_elf
from execwatch.binfmt.errors import ParseLimitExceeded
from execwatch.binfmt.symbols import (
    DynamicSymbols,
    SymbolLimits,
    SymbolRef,
    SymbolWork,
    read_dynamic_symbols,
)
from tests.binfmt.conftest import LIBFOO_C, LIBFOO_MAP
from tests.support.binfmt.cbuild import compile_c

HOST_LIBRARIES = [
    "/usr/lib/x86_64-linux-gnu/libc.so.6",
    "/usr/lib/x86_64-linux-gnu/libm.so.6",
    "/usr/lib/x86_64-linux-gnu/libstdc++.so.6",
    "/usr/lib/x86_64-linux-gnu/libcurl.so.4",
    "/usr/lib/x86_64-linux-gnu/libLLVM-14.so.1",  # llvm (setup): every name asked twice
]


def symbols_of(path: Path) -> DynamicSymbols:
    with open(path, "rb") as f:
        table = read_dynamic_symbols(f, read_elf(f))
    assert table is not None
    return table


def oracle_exports(path: Path) -> set[tuple[str, str | None]]:
    """(name, None) and (name, version) of every defined global, weak or unique symbol."""
    with open(path, "rb") as f:
        elf = ELFFile(f)
        dynsym = elf.get_section_by_name(".dynsym")
        assert isinstance(dynsym, SymbolTableSection)
        versions: dict[int, str] = {}
        versym: list[int] = []
        for section in elf.iter_sections():
            if isinstance(section, GNUVerDefSection):
                for verdef, aux in section.iter_versions():
                    versions[verdef["vd_ndx"]] = next(iter(aux)).name
            if isinstance(section, GNUVerSymSection):
                versym = [s["ndx"] for s in section.iter_symbols()]
        out: set[tuple[str, str | None]] = set()
        for i, sym in enumerate(dynsym.iter_symbols()):
            if sym["st_shndx"] == "SHN_UNDEF" or not sym.name:
                continue
            if sym["st_info"]["bind"] not in ("STB_GLOBAL", "STB_WEAK", "STB_LOOS"):
                continue
            out.add((sym.name, None))
            ndx = versym[i] if i < len(versym) else 0
            ndx = ndx if isinstance(ndx, int) else 0  # VER_NDX_LOCAL / GLOBAL
            if ndx & 0x7FFF in versions:
                out.add((sym.name, versions[ndx & 0x7FFF]))
    return out


def ref(name: str, version: str | None = None) -> SymbolRef:
    return SymbolRef(name.encode(), version, None)


@pytest.mark.parametrize("library", HOST_LIBRARIES)
def test_every_export_of_a_real_library_is_found_and_nothing_else(library: str) -> None:
    path = Path(library).resolve()
    table = symbols_of(path)
    exports = oracle_exports(path)
    assert len(exports) > 100
    assert [e for e in exports if table.defines(ref(*e)) is not True] == []
    assert [e for e in exports if table.defines(ref(*e)) is not True] == []  # no budget runs out
    names = sorted({name for name, _ in exports})[:500]
    absent = [ref(f"{name}_not_exported") for name in names]
    absent += [ref(name, "NO_SUCH_VERSION_1.0") for name in names]
    assert [r for r in absent if table.defines(r) is not False] == []


def test_an_import_is_read_with_its_version_and_library() -> None:
    """/bin/ls imports libc functions at GLIBC_2.x versions, nothing of its own."""
    imports = symbols_of(Path("/bin/ls")).imports
    by_name = {r.name: r for r in imports}
    assert by_name["malloc"].version == "GLIBC_2.2.5"
    assert by_name["malloc"].library == "libc.so.6"
    assert all(r.key == r.name.encode() for r in imports)


@pytest.mark.parametrize("style", ["gnu", "sysv", "both", "none"])
def test_each_hash_table_style_answers_the_same(tmp_path: Path, style: str) -> None:
    """ld's --hash-style=gnu, sysv and both, and a library with its hash section removed
    (the decoded export set): foo@FOO_1.0 and foo2@FOO_2.0 exist, foo@FOO_2.0 does not."""
    (tmp_path / "libfoo.map").write_text(LIBFOO_MAP)
    flags = ["-shared", "-fPIC", f"-Wl,--version-script={tmp_path / 'libfoo.map'}"]
    flags.append(f"-Wl,--hash-style={'gnu' if style == 'none' else style}")
    lib = compile_c(tmp_path / "libfoo.so.1", LIBFOO_C, "gcc", *flags)
    if style == "none":
        subprocess.run(["objcopy", "--remove-section=.gnu.hash", str(lib)], check=True)
    sections = {s.name for s in ELFFile(io.BytesIO(lib.read_bytes())).iter_sections()}
    assert (".hash" in sections, ".gnu.hash" in sections) == {
        "gnu": (False, True), "sysv": (True, False), "both": (True, True), "none": (False, False)
    }[style]  # fmt: skip
    table = symbols_of(lib)
    answers = {
        (name, version): table.defines(ref(name, version))
        for name in ("foo", "foo2", "bar")
        for version in (None, "FOO_1.0", "FOO_2.0")
    }
    assert {k for k, found in answers.items() if found} == {
        ("foo", None), ("foo", "FOO_1.0"), ("foo2", None), ("foo2", "FOO_2.0")
    }  # fmt: skip
    assert all(found is not None for found in answers.values())


def libfoo(tmp_path: Path) -> Path:
    (tmp_path / "libfoo.map").write_text(LIBFOO_MAP)
    flags = ["-shared", "-fPIC", "-Wl,-soname,libfoo.so.1"]
    return compile_c(
        tmp_path / "libfoo.so.1", LIBFOO_C, "gcc", *flags,
        f"-Wl,--version-script={tmp_path / 'libfoo.map'}",
    )  # fmt: skip


def test_a_verdaux_shared_by_two_verdefs_is_read_as_the_oracle_reads_it(tmp_path: Path) -> None:
    """Linkers may point two Verdefs at one Verdaux (Debian's libjansson.so.4 does): that
    is no loop, and each Verdef takes its name. Here FOO_1.0's Verdef is pointed at the
    Verdaux of FOO_2.0 (vd_aux only points forward), so foo's version reads FOO_2.0, for
    pyelftools as for the reader."""
    lib = libfoo(tmp_path)
    data = bytearray(lib.read_bytes())
    with open(lib, "rb") as f:
        section = ELFFile(f).get_section_by_name(".gnu.version_d")
        assert section is not None
        start = section["sh_offset"]
    verdefs, pos = [], start
    while True:
        aux, nxt = struct.unpack_from("<II", data, pos + 12)
        verdefs.append((pos, pos + aux))
        if not nxt:
            break
        pos += nxt
    (foo1, _), (_, foo2_aux) = verdefs[1], verdefs[2]
    struct.pack_into("<I", data, foo1 + 12, foo2_aux - foo1)
    lib.write_bytes(bytes(data))
    table = symbols_of(lib)
    exports = oracle_exports(lib)
    assert {("foo", "FOO_2.0"), ("foo2", "FOO_2.0")} <= exports
    assert ("foo", "FOO_1.0") not in exports
    assert [e for e in exports if table.defines(ref(*e)) is not True] == []
    assert table.defines(ref("foo", "FOO_1.0")) is False


def test_every_version_record_walked_is_counted_once_per_step() -> None:
    """/bin/ls: one record per Verneed and Vernaux (pyelftools counts them) and nothing
    past the budget; a smaller budget refuses the file rather than reading part of it."""
    with open("/bin/ls", "rb") as f:
        needs = next(s for s in ELFFile(f).iter_sections() if isinstance(s, GNUVerNeedSection))
        records = sum(1 + len(list(aux)) for _, aux in needs.iter_versions())
        info = read_elf(f)
        work = SymbolWork()
        assert read_dynamic_symbols(f, info, work=work) is not None
        assert work.records == records
        with pytest.raises(ParseLimitExceeded, match="symbol version records"):
            read_dynamic_symbols(f, info, work=SymbolWork(SymbolLimits(max_records=records - 1)))


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        (SymbolLimits(max_read_bytes=4096), "bytes of symbol tables"),
        (SymbolLimits(max_name_bytes=64), "bytes of symbol names"),
        (SymbolLimits(max_steps=16), "steps reading symbols"),
        (SymbolLimits(max_seconds=0.0), "took more than"),
    ],
)
def test_each_budget_refuses_rather_than_returning_part(limits: SymbolLimits, message: str) -> None:
    with open("/bin/ls", "rb") as f:
        info = read_elf(f)
        with pytest.raises(ParseLimitExceeded, match=message):
            read_dynamic_symbols(f, info, work=SymbolWork(limits))
