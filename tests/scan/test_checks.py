"""The checks, each on a small amd64 image assembled from real host gcc and musl builds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.images.base_images import glibc_base, musl_base
from tests.support.images.imagebuild import Image, directory, file, oci_layout, symlink
from tests.support.scan.scan_cli import checks, scan_json

GLIBC_LOADER = "/lib64/ld-linux-x86-64.so.2"


def scan_image(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], image: Image, *argv: str
) -> tuple[int, dict[str, Any]]:
    layout = oci_layout(tmp_path / "layout", [image])
    return scan_json(capsys, str(layout), *argv)


def test_a_clean_glibc_image_has_no_findings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], built: dict[str, Path],
    host_glibc: dict[str, bytes],
) -> None:  # fmt: skip
    image = Image([glibc_base(host_glibc), [file("usr/bin/hello", built["glibc"].read_bytes())]])
    code, doc = scan_image(tmp_path, capsys, image)
    assert (code, doc["findings"]) == (0, [])
    (result,) = doc["images"]
    assert result["platform"] == "linux/amd64" and result["stats"]["elf"] >= 2


def test_missing_loader_is_missing_interpreter(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], built: dict[str, Path]
) -> None:
    image = Image([[file("usr/bin/hello", built["glibc"].read_bytes())]])
    code, doc = scan_image(tmp_path, capsys, image)
    assert code == 1
    assert checks(doc) == {("missing-interpreter", "/usr/bin/hello")}


def test_glibc_binary_on_musl_image_is_missing_interpreter(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], built: dict[str, Path], host_musl: bytes
) -> None:
    image = Image([musl_base(host_musl), [file("app", built["glibc"].read_bytes())]])
    code, doc = scan_image(tmp_path, capsys, image)
    assert code == 1
    (finding,) = doc["findings"]
    assert (finding["check"], finding["severity"]) == ("missing-interpreter", "error")
    assert "a glibc binary in a musl image" in finding["message"]
    assert "exit 127" in finding["message"]


def test_gcompat_makes_it_start_but_warns_about_exit_139(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], built: dict[str, Path], host_musl: bytes
) -> None:
    gcompat = [
        file("lib/libgcompat.so.0", b"stand-in for gcompat", 0o644),
        directory("lib64"),
        symlink("lib64/ld-linux-x86-64.so.2", "/lib/ld-musl-x86_64.so.1"),
    ]
    image = Image([musl_base(host_musl), gcompat, [file("app", built["glibc"].read_bytes())]])
    code, doc = scan_image(tmp_path, capsys, image)
    found = [(f["check"], f["severity"], f["path"]) for f in doc["findings"]]
    assert ("libc-mismatch", "warning", "/app") in found
    assert not any(c == "missing-library" for c, _, _ in found)  # libc.so.6 is musl-reserved
    assert code == 0  # default --fail-on error
    code, _ = scan_image(tmp_path / "again", capsys, image, "--fail-on", "warning")
    assert code == 1


def test_musl_binary_on_glibc_image_is_missing_interpreter(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], built: dict[str, Path],
    host_glibc: dict[str, bytes],
) -> None:  # fmt: skip
    image = Image([glibc_base(host_glibc), [file("app", built["musl"].read_bytes())]])
    _, doc = scan_image(tmp_path, capsys, image)
    assert checks(doc) == {("missing-interpreter", "/app")}
    assert "a musl binary in a glibc image" in doc["findings"][0]["message"]


def test_musl_image_resolves_reserved_names_and_the_path_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], built: dict[str, Path], host_musl: bytes
) -> None:
    app = [file("usr/bin/app", built["uses-foo-musl"].read_bytes()),
           file("opt/foo/libfoo.so.1", built["libfoo-musl"].read_bytes())]  # fmt: skip
    _, doc = scan_image(tmp_path / "a", capsys, Image([musl_base(host_musl), app]))
    assert checks(doc) == {("missing-library", "/usr/bin/app")}  # /opt/foo is not searched
    path_file = [file("etc/ld-musl-x86_64.path", b"/opt/foo\n/usr/lib\n", 0o644)]
    _, doc = scan_image(tmp_path / "b", capsys, Image([musl_base(host_musl), app, path_file]))
    assert doc["findings"] == []


def test_glibc_search_order_ld_so_conf_includes_and_env(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], built: dict[str, Path],
    host_glibc: dict[str, bytes],
) -> None:  # fmt: skip
    app = [file("usr/bin/app", built["uses-foo"].read_bytes()),
           file("opt/foo/lib/libfoo.so.1", built["libfoo-v12"].read_bytes(), 0o644)]  # fmt: skip
    base = glibc_base(host_glibc)
    _, doc = scan_image(tmp_path / "a", capsys, Image([base, app]))
    assert checks(doc) == {("missing-library", "/usr/bin/app")}
    conf = [file("etc/ld.so.conf", b"# comment\ninclude /etc/ld.so.conf.d/*.conf\n", 0o644),
            file("etc/ld.so.conf.d/foo.conf", b"/opt/foo/lib\n", 0o644)]  # fmt: skip
    _, doc = scan_image(tmp_path / "b", capsys, Image([base, app, conf]))
    assert doc["findings"] == []
    env_image = Image([base, app], env=["LD_LIBRARY_PATH=/opt/foo/lib"])
    _, doc = scan_image(tmp_path / "c", capsys, env_image)
    assert doc["findings"] == []


def test_origin_runpath_is_relative_to_the_binary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], built: dict[str, Path],
    host_glibc: dict[str, bytes],
) -> None:  # fmt: skip
    lib = built["libfoo-v12"].read_bytes()
    good = [file("app/bin/app", built["uses-foo-origin"].read_bytes()),
            file("app/lib/foo/libfoo.so.1", lib, 0o644)]  # fmt: skip
    _, doc = scan_image(tmp_path / "a", capsys, Image([glibc_base(host_glibc), good]))
    assert doc["findings"] == []
    moved = [file("app/sbin/x/app", built["uses-foo-origin"].read_bytes()),
             file("app/lib/foo/libfoo.so.1", lib, 0o644)]  # fmt: skip
    _, doc = scan_image(tmp_path / "b", capsys, Image([glibc_base(host_glibc), moved]))
    assert checks(doc) == {("missing-library", "/app/sbin/x/app")}


@pytest.mark.parametrize(("library", "missing"), [("v1", True), ("v13", True), ("v12", False)])
def test_symbol_versions_are_set_membership_not_a_maximum(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], built: dict[str, Path],
    host_glibc: dict[str, bytes], library: str, missing: bool,
) -> None:  # fmt: skip
    """uses-foo needs FOO_2.0: a library defining FOO_1.0 and FOO_3.0 does not satisfy it."""
    app = [file("usr/bin/app", built["uses-foo"].read_bytes()),
           file("usr/lib/x86_64-linux-gnu/libfoo.so.1",
                built[f"libfoo-{library}"].read_bytes())]  # fmt: skip
    _, doc = scan_image(tmp_path, capsys, Image([glibc_base(host_glibc), app]))
    if not missing:
        assert doc["findings"] == []
        return
    (finding,) = doc["findings"]
    assert finding["check"] == "missing-symbol-version"
    assert "version `FOO_2.0' not found (required by /usr/bin/app)" in finding["message"]


def test_wrong_abi_library_is_skipped_like_glibc_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], built: dict[str, Path],
    host_glibc: dict[str, bytes], foreign_root: Path,
) -> None:  # fmt: skip
    arm_libc = next((foreign_root / "arm64/root").rglob("libc.so.6")).read_bytes()
    app = [file("usr/bin/app", built["uses-foo"].read_bytes()),
           file("usr/lib/x86_64-linux-gnu/libfoo.so.1", arm_libc, 0o644),  # arm64, in the way
           file("usr/lib/libfoo.so.1", built["libfoo-v12"].read_bytes())]  # fmt: skip
    _, doc = scan_image(tmp_path, capsys, Image([glibc_base(host_glibc), app]))
    assert doc["findings"] == []


def test_shebang_checks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], built: dict[str, Path],
    host_glibc: dict[str, bytes],
) -> None:  # fmt: skip
    sh = built["glibc"].read_bytes()  # stands in for /bin/sh
    scripts = [
        file("usr/bin/sh", sh),
        file("ok.sh", b"#!/bin/sh\necho ok\n"),
        file("dos.sh", b"#!/bin/sh\r\necho ok\r\n"),
        file("bash.sh", b"#!/bin/bash\necho\n"),
        file("usr/bin/env", sh),
        file("py", b"#!/usr/bin/env python3\nprint()\n"),
        file("py-u", b"#!/usr/bin/env python3 -u\nprint()\n"),
        file("split", b"#!/usr/bin/env -S sh -e\necho\n"),
        file("not-exec.sh", b"#!/bin/bash\n", 0o644),
        file("data.txt", b"no shebang", 0o755),
    ]
    _, doc = scan_image(tmp_path, capsys, Image([glibc_base(host_glibc), scripts]))
    assert checks(doc) == {
        ("shebang-crlf", "/dos.sh"),
        ("missing-shebang-interpreter", "/bash.sh"),
        ("env-not-on-PATH", "/py"),
        ("env-not-on-PATH", "/py-u"),  # without -S, "python3 -u" is ONE name to env
    }
    crlf = next(f for f in doc["findings"] if f["check"] == "shebang-crlf")
    assert "'/bin/sh\\r'" in crlf["message"]


def test_env_uses_the_image_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], built: dict[str, Path],
    host_glibc: dict[str, bytes],
) -> None:  # fmt: skip
    layer = [file("usr/bin/env", built["glibc"].read_bytes()),
             file("opt/py/bin/python3", built["glibc"].read_bytes()),
             file("run", b"#!/usr/bin/env python3\n")]  # fmt: skip
    image = Image([glibc_base(host_glibc), layer], env=["PATH=/opt/py/bin:/usr/bin"])
    _, doc = scan_image(tmp_path, capsys, image)
    assert doc["findings"] == []


def test_entrypoint_is_checked_first_and_marked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], built: dict[str, Path],
    foreign_root: Path, host_glibc: dict[str, bytes],
) -> None:  # fmt: skip
    arm = (foreign_root / "arm64/root/usr/bin/hello").read_bytes()
    layer = [file("usr/bin/aaa-tool", arm), file("usr/local/bin/server", arm),
             file("zzz", b"#!/bin/sh\r\n")]  # fmt: skip
    image = Image([glibc_base(host_glibc), layer], entrypoint=["server"], cmd=["--port", "80"])
    _, doc = scan_image(tmp_path, capsys, image)
    first = doc["findings"][0]
    assert (first["check"], first["path"], first.get("entrypoint")) == (
        "arch-mismatch", "/usr/local/bin/server", True,
    )  # fmt: skip
    others = doc["findings"][1:]
    # most ELF executables are arm64 while the config says amd64: one image-level finding
    assert {f["path"] for f in others} == {"/usr/bin/aaa-tool", "/zzz", "(image config)"}
    assert not any(f.get("entrypoint") for f in others)
    assert doc["images"][0]["entrypoint"] == ["server", "--port", "80"]


def test_script_entrypoint_marks_its_interpreter(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], foreign_root: Path,
    host_glibc: dict[str, bytes],
) -> None:  # fmt: skip
    arm_sh = (foreign_root / "arm64/root/usr/bin/busybox").read_bytes()
    layer = [file("usr/bin/sh", arm_sh), file("app/run.sh", b"#!/bin/sh\nexec app\n")]
    image = Image([glibc_base(host_glibc), layer], cmd=["./run.sh"], workdir="/app")
    _, doc = scan_image(tmp_path, capsys, image)
    finding, image_level = doc["findings"]
    assert (finding["check"], finding["path"], finding["entrypoint"]) == (
        "arch-mismatch", "/usr/bin/sh", True,
    )  # fmt: skip
    assert image_level["path"] == "(image config)"  # the only ELF program is arm64


def test_missing_entrypoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], host_glibc: dict[str, bytes]
) -> None:
    image = Image([glibc_base(host_glibc)], entrypoint=["/docker-entrypoint.sh"])
    code, doc = scan_image(tmp_path, capsys, image)
    assert code == 1
    assert checks(doc) == {("missing-entrypoint", "/docker-entrypoint.sh")}


def test_require_static_counts_static_pie_as_static(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], built: dict[str, Path],
    host_glibc: dict[str, bytes],
) -> None:  # fmt: skip
    layer = [file("static-pie", built["glibc-static-pie"].read_bytes()),
             file("musl-static", built["musl-static"].read_bytes()),
             file("dynamic", built["glibc"].read_bytes())]  # fmt: skip
    image = Image([glibc_base(host_glibc), layer])
    code, doc = scan_image(tmp_path / "a", capsys, image)
    assert (code, doc["findings"]) == (0, [])
    code, doc = scan_image(tmp_path / "b", capsys, image, "--require-static")
    assert code == 1
    assert ("not-static", "/dynamic") in checks(doc)
    assert not {p for c, p in checks(doc) if c == "not-static"} & {"/static-pie", "/musl-static"}


def test_single_file_is_checked_against_the_node_or_platform(
    capsys: pytest.CaptureFixture[str], built: dict[str, Path], foreign_root: Path
) -> None:
    hello_arm = str(foreign_root / "arm64/root/usr/bin/hello")
    code, doc = scan_json(capsys, hello_arm, "--platform", "linux/arm64")
    assert (code, doc["findings"]) == (0, [])
    code, doc = scan_json(capsys, hello_arm, "--platform", "linux/amd64")
    assert checks(doc) == {("arch-mismatch", hello_arm)}
    code, doc = scan_json(capsys, str(built["glibc"]), "--require-static")
    assert checks(doc) == {("not-static", str(built["glibc"]))}
    code, doc = scan_json(capsys, str(built["glibc-static-pie"]), "--require-static")
    assert (code, doc["findings"]) == (0, [])
