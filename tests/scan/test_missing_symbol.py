"""missing-symbol: an import that no loaded library exports, with the version asked for.

trixie's curl imports curl_global_trace@CURL_OPENSSL_4; bookworm's libcurl.so.4 has the
CURL_OPENSSL_4 version node (so missing-symbol-version passes) but not that symbol: the
loader says "symbol lookup error: undefined symbol: curl_global_trace, version
CURL_OPENSSL_4" and exits 127. The same linker code diagnoses it on a node.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.probe.roots import glibc_root, needed_libraries, newer_package
from tests.scan.helpers import checks, scan_json

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
