"""missing-symbol: an import that no loaded library exports, with the version asked for.

trixie's curl imports curl_global_trace@CURL_OPENSSL_4; bookworm's libcurl.so.4 has the
CURL_OPENSSL_4 version node (so missing-symbol-version passes) but not that symbol: the
loader says "symbol lookup error: undefined symbol: curl_global_trace, version
CURL_OPENSSL_4" and exits 127. The same linker code diagnoses it on a node.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.binfmt.cbuild import HELLO_C, compile_c
from tests.support.probe.debian_roots import glibc_root, needed_libraries, newer_package
from tests.support.scan.scan_cli import checks, scan_json

HOST_LIBCURL = Path("/usr/lib/x86_64-linux-gnu/libcurl.so.4")


def curl_root(root: Path) -> Path:
    curl = newer_package("curl") / "usr/bin/curl"
    libs = {"libcurl.so.4": HOST_LIBCURL} | needed_libraries(HOST_LIBCURL)
    return glibc_root(root, {"/usr/bin/curl": curl}, extra_libraries=libs)


def test_newer_curl_against_an_older_libcurl(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = curl_root(tmp_path / "root")
    loader = subprocess.run(
        ["chroot", root, "/usr/bin/curl", "--version"], capture_output=True, text=True
    )
    assert loader.returncode == 127 and "undefined symbol: curl_global_trace" in loader.stderr

    _, doc = scan_json(capsys, str(root))

    assert checks(doc) == {("missing-symbol", "/usr/bin/curl")}
    messages = [f["message"] for f in doc["findings"]]
    assert any("curl_global_trace, version CURL_OPENSSL_4" in m for m in messages), messages
    assert all("version CURL_OPENSSL_4" in m for m in messages), messages


def test_the_hosts_own_curl_closure_has_nothing_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same root with a binary built against this libcurl: no finding (no false alarm
    from unversioned or weak imports)."""
    root = glibc_root(
        tmp_path / "root",
        {"/usr/bin/app": Path("/usr/bin/ls")},
        extra_libraries={"libcurl.so.4": HOST_LIBCURL} | needed_libraries(HOST_LIBCURL),
    )
    _, doc = scan_json(capsys, str(root))
    assert doc["findings"] == []


def test_a_symlinked_loader_as_debian_ships_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Debian's PT_INTERP, /lib64/ld-linux-x86-64.so.2, is a chain of symlinks (merged /usr):
    the loader's own symbols are read from the file the chain ends at."""
    root = curl_root(tmp_path / "root")
    real = root / "usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"
    (root / "lib64/ld-linux-x86-64.so.2").rename(real)
    (root / "lib64").rmdir()
    (root / "usr/lib64").mkdir()
    (root / "usr/lib64/ld-linux-x86-64.so.2").symlink_to(
        "../lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"
    )
    (root / "lib64").symlink_to("usr/lib64")
    loader = subprocess.run(
        ["chroot", root, "/usr/bin/curl", "--version"], capture_output=True, text=True
    )
    assert loader.returncode == 127 and "undefined symbol: curl_global_trace" in loader.stderr

    _, doc = scan_json(capsys, str(root))

    assert checks(doc) == {("missing-symbol", "/usr/bin/curl")}


FORTIFIED_C = (
    '#include <stdio.h>\nint main(int argc, char **argv) { printf("%d %s\\n", argc, argv[0]);'
    " return 0; }\n"
)


def gcompat_root(root: Path, programs: dict[str, Path]) -> Path:
    """An Alpine-like root with gcompat's layout: ld-linux-x86-64.so.2 -> musl's loader."""
    (root / "lib").mkdir(parents=True)
    shutil.copy(Path("/lib/ld-musl-x86_64.so.1").resolve(), root / "lib/ld-musl-x86_64.so.1")
    (root / "lib/libgcompat.so.0").write_bytes(b"stand-in: gcompat only has to be there")
    (root / "lib64").mkdir()
    (root / "lib64/ld-linux-x86-64.so.2").symlink_to("/lib/ld-musl-x86_64.so.1")
    (root / "app").mkdir()
    for name, program in programs.items():
        shutil.copy(program, root / "app" / name)
    return root


def test_under_musl_a_glibc_import_is_bound_by_name_whatever_its_version(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """musl's loader ignores symbol versions: puts@GLIBC_2.2.5 binds to musl's puts and the
    program runs, while __printf_chk (glibc's _FORTIFY_SOURCE) is not in musl at all."""
    plain = compile_c(tmp_path / "plain", HELLO_C, "gcc")
    fortified = compile_c(tmp_path / "fortified", FORTIFIED_C, "gcc", "-O2", "-D_FORTIFY_SOURCE=2")
    root = gcompat_root(tmp_path / "root", {"plain": plain, "fortified": fortified})
    ran = [subprocess.run(["chroot", root, f"/app/{p}"], capture_output=True, text=True)
           for p in ("plain", "fortified")]  # fmt: skip
    assert ran[0].returncode == 0 and ran[0].stdout == "hi\n"
    assert ran[1].returncode == 127
    assert "Error relocating /app/fortified: __printf_chk: symbol not found" in ran[1].stderr

    _, doc = scan_json(capsys, str(root))

    assert checks(doc) == {
        ("libc-mismatch", "/app/plain"), ("libc-mismatch", "/app/fortified"),
        ("missing-symbol", "/app/fortified"),
    }  # fmt: skip
    (symbol,) = [f["message"] for f in doc["findings"] if f["check"] == "missing-symbol"]
    assert "undefined symbol: __printf_chk (" in symbol  # no version: musl never asks one
