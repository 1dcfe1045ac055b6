"""read_elf on real binaries: Debian's packages for seven architectures, host gcc and musl."""

from __future__ import annotations

import io
from pathlib import Path
from typing import BinaryIO

import pytest

from execwatch.binfmt import (
    GLIBC_LOADERS,
    ElfInfo,
    Platform,
    VersionRequirement,
    glibc_loader,
    libc_flavor,
    musl_loader,
    read_elf,
)

# debian arch -> (OCI platform, glibc PT_INTERP of Debian's `hello`, class, little endian)
DEBIAN = {
    "arm64": ("linux/arm64", "/lib/ld-linux-aarch64.so.1", 2, True),
    "armhf": ("linux/arm/v7", "/lib/ld-linux-armhf.so.3", 1, True),
    "i386": ("linux/386", "/lib/ld-linux.so.2", 1, True),
    "ppc64el": ("linux/ppc64le", "/lib64/ld64.so.2", 2, True),
    "s390x": ("linux/s390x", "/lib/ld64.so.1", 2, False),
    "riscv64": ("linux/riscv64", "/lib/ld-linux-riscv64-lp64d.so.1", 2, True),
    "mips64el": ("linux/mips64le", "/lib64/ld.so.1", 2, True),
}


def elf_at(path: Path) -> ElfInfo:
    with path.open("rb") as f:
        return read_elf(f)


def busybox(root: Path) -> Path:
    # bookworm's busybox-static (mips64el) still installs to /bin
    return next(p for p in (root / "usr/bin/busybox", root / "bin/busybox") if p.exists())


@pytest.mark.parametrize("debarch", sorted(DEBIAN))
def test_debian_hello_is_a_dynamic_glibc_pie_for_its_platform(
    foreign_root: Path, debarch: str
) -> None:
    platform, interp, elf_class, little = DEBIAN[debarch]
    info = elf_at(foreign_root / debarch / "root/usr/bin/hello")
    assert str(info.platform) == platform
    assert (info.elf_class, info.little_endian) == (elf_class, little)
    assert info.interpreter == interp
    assert glibc_loader(info) == interp, "the loader table must agree with Debian's binaries"
    assert libc_flavor(info.interpreter) == "glibc"
    assert not info.is_static and info.is_executable and info.is_pie
    assert "libc.so.6" in info.needed
    libc_versions = {
        v.name for need in info.version_needs if need.file == "libc.so.6" for v in need.versions
    }
    assert "GLIBC_2.34" in libc_versions  # __libc_start_main@GLIBC_2.34 since glibc 2.34


@pytest.mark.parametrize("debarch", sorted(DEBIAN))
def test_debian_busybox_static_is_static(foreign_root: Path, debarch: str) -> None:
    info = elf_at(busybox(foreign_root / debarch / "root"))
    assert str(info.platform) == DEBIAN[debarch][0]
    assert info.is_static and info.interpreter is None and info.needed == ()
    assert info.is_executable


@pytest.mark.parametrize("debarch", sorted(DEBIAN))
def test_debian_libc_defines_the_versions_hello_needs(foreign_root: Path, debarch: str) -> None:
    root = foreign_root / debarch / "root"
    libc = next(p for p in root.rglob("libc.so.6"))
    info = elf_at(libc)
    assert info.soname == "libc.so.6"
    hello = elf_at(root / "usr/bin/hello")
    needed = {v.name for n in hello.version_needs if n.file == "libc.so.6" for v in n.versions}
    assert {"GLIBC_2.34", "GLIBC_2.36"} <= info.version_defs
    # hello comes from trixie; where the mirror gave bookworm's glibc 2.36 the pair is a real
    # "version `GLIBC_2.38' not found": membership, not a maximum, decides.
    assert needed - info.version_defs <= {"GLIBC_2.38"}
    assert str(info.platform) == DEBIAN[debarch][0]


def test_armhf_binaries_carry_hard_float_and_v7(foreign_root: Path) -> None:
    info = elf_at(foreign_root / "armhf/root/usr/bin/hello")
    assert info.float_abi == "hard"
    assert info.platform == Platform("linux", "arm", "v7")
    assert info.flags & 0xFF000000 == 0x05000000  # EABI version 5


def test_glibc_loader_table_covers_every_debian_loader(foreign_root: Path) -> None:
    shipped = {
        "/" + str(p.relative_to(foreign_root / d / "root")).replace("usr/", "", 1)
        for d in DEBIAN
        for p in (foreign_root / d / "root").rglob("ld*.so.*")
        if p.parent.name in ("lib", "lib64")
    }
    assert shipped <= set(GLIBC_LOADERS.values())


def test_host_glibc_binaries(host_binaries: dict[str, Path]) -> None:
    dynamic = elf_at(host_binaries["glibc"])
    assert dynamic.interpreter == "/lib64/ld-linux-x86-64.so.2"
    assert dynamic.platform == Platform("linux", "amd64")
    assert dynamic.needed == ("libc.so.6",)
    static = elf_at(host_binaries["glibc-static"])
    assert static.is_static and static.elf_type == 2 and static.is_executable


def test_static_pie_counts_as_static(host_binaries: dict[str, Path]) -> None:
    info = elf_at(host_binaries["glibc-static-pie"])
    assert info.elf_type == 3 and info.has_dynamic  # ET_DYN with a dynamic section ...
    assert info.interpreter is None and info.needed == ()
    assert info.is_static and info.is_executable  # ... yet nothing to load


def test_musl_binaries(host_binaries: dict[str, Path]) -> None:
    dynamic = elf_at(host_binaries["musl"])
    assert dynamic.interpreter == "/lib/ld-musl-x86_64.so.1"
    assert libc_flavor(dynamic.interpreter) == "musl"
    assert musl_loader(dynamic) == dynamic.interpreter
    assert dynamic.needed == ("libc.so",)
    assert dynamic.version_needs == ()  # musl has no symbol versioning
    assert elf_at(host_binaries["musl-static"]).is_static


def test_shared_library_soname_versions_and_rpath(host_binaries: dict[str, Path]) -> None:
    lib = elf_at(host_binaries["libfoo"])
    assert lib.soname == "libfoo.so.1"
    assert lib.version_defs == {"libfoo.so.1", "FOO_1.0", "FOO_2.0"}
    assert not lib.is_executable
    exe = elf_at(host_binaries["uses-foo"])
    assert exe.rpath == ("$ORIGIN/../lib", "/opt/foo") and exe.runpath == ()
    need = next(n for n in exe.version_needs if n.file == "libfoo.so.1")
    assert need.versions == (VersionRequirement("FOO_2.0", weak=False),)


class CountingReader(io.FileIO):
    """A file that counts the bytes read through it."""

    bytes_read = 0

    def readinto(self, b: memoryview) -> int:  # type: ignore[override]
        n = super().readinto(b)
        self.bytes_read += n or 0
        return n or 0


def test_reads_only_headers_of_a_large_library() -> None:
    libc = Path("/usr/lib/x86_64-linux-gnu/libc.so.6")
    assert libc.stat().st_size > 1_000_000
    f = CountingReader(libc)
    with f:
        stream: BinaryIO = io.BufferedReader(f, buffer_size=4096)
        info = read_elf(stream)
    assert info.soname == "libc.so.6" and "GLIBC_2.34" in info.version_defs
    assert f.bytes_read < 64 * 1024, f"read {f.bytes_read} bytes of {libc.stat().st_size}"
