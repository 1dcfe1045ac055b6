"""UnsupportedCPU in the early-death diagnosis: which check wins, as glibc's loader orders them.

Pure logic over a root of this host's real glibc files and programs built by gcc with
`-Wl,-z,x86-64-v3`, with the CPU's levels given (this host has v4, so it cannot refuse
them). The real refusal, caught by the probe in a guest CPU without v3, is
tests/kernels/test_cpu_level.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from execwatch.binfmt.isa import BASELINE, V2, V3, V4
from execwatch.diagnosis.startup import explain
from execwatch.record import Reason
from execwatch.runnable.directory import DirectoryFS
from tests.support.binfmt.cbuild import build_level_programs, compile_c
from tests.support.probe.debian_roots import copy_into, glibc_root

V2_CPU = BASELINE | V2
V4_CPU = BASELINE | V2 | V3 | V4


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_level_programs(tmp_path_factory.mktemp("level-bin"))


def root_with(tmp: Path, built: dict[str, Path], *, omit_lib: bool = False) -> DirectoryFS:
    names = ["needs-v3", "uses-v3-lib"] + ([] if omit_lib else ["libv3.so"])
    omit = ["libv3.so"]  # found by ldd through $ORIGIN: only under /app, when wanted
    root = glibc_root(tmp / "root", {f"/app/{n}": built[n] for n in names}, omit=omit)
    return DirectoryFS(str(root))


def explained(fs: DirectoryFS, path: str, cpu: int | None) -> tuple[Reason, str | None, str | None]:
    node = fs.node(path)
    assert node is not None and node.elf is not None
    finding = explain(fs, path, node.elf, cpu)
    assert finding is not None
    return finding.reason, finding.library, finding.version


def test_the_program_needs_a_level_the_cpu_lacks(tmp_path: Path, built: dict[str, Path]) -> None:
    fs = root_with(tmp_path, built)
    reason, library, version = explained(fs, "/app/needs-v3", V2_CPU)
    assert (reason, library, version) == (Reason.UNSUPPORTED_CPU, None, "x86-64-v3")
    node = fs.node("/app/needs-v3")
    assert node is not None and node.elf is not None
    finding = explain(fs, "/app/needs-v3", node.elf, V2_CPU)
    assert finding is not None
    assert finding.detail.startswith("/app/needs-v3 requires x86-64-v3, this CPU has x86-64-v2")


def test_a_library_needs_it(tmp_path: Path, built: dict[str, Path]) -> None:
    fs = root_with(tmp_path, built)
    assert explained(fs, "/app/uses-v3-lib", V2_CPU) == (
        Reason.UNSUPPORTED_CPU, "/app/libv3.so", "x86-64-v3",
    )  # fmt: skip


def test_a_cpu_with_the_level_or_an_unknown_cpu_explains_nothing(
    tmp_path: Path, built: dict[str, Path]
) -> None:
    fs = root_with(tmp_path, built)
    for cpu in (V4_CPU, None):
        node = fs.node("/app/uses-v3-lib")
        assert node is not None and node.elf is not None
        assert explain(fs, "/app/uses-v3-lib", node.elf, cpu) is None


def test_a_missing_library_comes_first(tmp_path: Path, built: dict[str, Path]) -> None:
    """ld.so maps every library before it checks levels: the missing one is what it says."""
    fs = root_with(tmp_path, built, omit_lib=True)
    assert explained(fs, "/app/uses-v3-lib", V2_CPU) == (Reason.MISSING_LIBRARY, "libv3.so", None)
    assert not any(p.name == "libv3.so" for p in Path(fs.root).rglob("*"))


STUB_LIBC_C = "void exit(int code) { for (;;) (void)code; }\n"
STUB_LIBC_MAP = "GLIBC_2.2.5 { global: exit; local: *; };\n"
NO_CRT_C = "void exit(int);\nvoid _start(void) { exit(0); }\n"


def test_a_glibc_older_than_2_33_does_not_check_levels(tmp_path: Path) -> None:
    """Its libc.so.6 lacks GLIBC_2.33: ld.so lets the program run into SIGILL instead. The
    stand-in libc defines only GLIBC_2.2.5's exit; the same program with the host's real
    libc (2.36) is refused."""
    d = tmp_path / "bin"
    d.mkdir()
    (d / "libc.map").write_text(STUB_LIBC_MAP)
    stub = compile_c(d / "libc.so.6", STUB_LIBC_C, "gcc", "-shared", "-fPIC", "-nostdlib",
                     "-fno-builtin", "-Wl,-soname,libc.so.6",
                     f"-Wl,--version-script={d / 'libc.map'}")  # fmt: skip
    exe = compile_c(d / "old-v3", NO_CRT_C, "gcc", "-nostdlib", "-fno-builtin", f"-L{d}",
                    "-l:libc.so.6", "-Wl,-z,x86-64-v3",
                    "-Wl,--dynamic-linker=/lib64/ld-linux-x86-64.so.2")  # fmt: skip
    real_libc = Path("/lib/x86_64-linux-gnu/libc.so.6")
    for libc, refused in ((stub, False), (real_libc, True)):
        root = tmp_path / f"root-{refused}"
        copy_into(root, exe, "/app/old-v3")
        copy_into(root, libc, "/usr/lib/x86_64-linux-gnu/libc.so.6")
        copy_into(root, Path("/lib64/ld-linux-x86-64.so.2"), "/lib64/ld-linux-x86-64.so.2")
        fs = DirectoryFS(str(root))
        node = fs.node("/app/old-v3")
        assert node is not None and node.elf is not None and node.elf.x86_isa_needed & V3
        finding = explain(fs, "/app/old-v3", node.elf, V2_CPU)
        reason = finding.reason if finding is not None else None
        assert reason == (Reason.UNSUPPORTED_CPU if refused else None)
