"""An entrypoint the runtime cannot start on any node: no `#!` line (missing-shebang, with
the cause from its first bytes) or another OS's executable (foreign-os, named with its OS
and architecture: real Go cross-compiles). `execwatch scan` of such an image exits 1 with
ONE error finding; other files of another OS are warnings, other data files silent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.binfmt.foreignos import universal
from tests.support.images.imagebuild import Image, file, oci_layout
from tests.support.scan.scan_cli import scan_json


def scan(tmp_path: Path, capsys: pytest.CaptureFixture[str], image: Image, *argv: str) -> Any:
    layout = oci_layout(tmp_path / "layout", [image])
    return scan_json(capsys, str(layout), *argv)


def entry_image(data: bytes, *others: tuple[str, bytes]) -> Image:
    """/app/run as the entrypoint, nothing else but `others`: no shell, no libc."""
    layer = [file("app/run", data), *(file(path, body) for path, body in others)]
    return Image([layer], entrypoint=["/app/run"], cmd=["--serve"])


CAUSES = {
    "no-shebang": (b"echo hello\n", 'no #! interpreter line (first bytes: "echo hello\\n")'),
    "bom": (
        b"\xef\xbb\xbf#!/bin/sh\necho hello\n",
        "a UTF-8 byte order mark (EF BB BF) before #!: the kernel sees no #!"
        ' (first bytes: "\\xef\\xbb\\xbf#!/bin/sh\\necho hello\\n")',
    ),
    "blank-first-line": (
        b"\n#!/bin/sh\necho hello\n",
        "a blank first line before #!: #! must be the file's first two bytes"
        ' (first bytes: "\\n#!/bin/sh\\necho hello\\n")',
    ),
    "empty-shebang": (
        b"#!\necho hello\n",
        "a #! line that names no interpreter (empty, or too long for the kernel)"
        ' (first bytes: "#!\\necho hello\\n")',
    ),
    "crlf": (
        b"echo hello\r\n",
        'no #! interpreter line, and CRLF (Windows) line endings (first bytes: "echo hello\\r\\n")',
    ),
}


@pytest.mark.parametrize("case", sorted(CAUSES))
def test_an_entrypoint_without_a_shebang_is_one_error_naming_its_cause(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    data, cause = CAUSES[case]
    code, doc = scan(tmp_path, capsys, entry_image(data))
    assert code == 1, doc
    [finding] = doc["findings"]
    assert (finding["check"], finding["severity"], finding["path"], finding["entrypoint"]) == (
        "missing-shebang", "error", "/app/run", True,
    )  # fmt: skip
    assert finding["message"] == (
        "neither ELF nor a #! script: the container runtime's exec fails (exec format error)"
        f" on every node; {cause}"
    )
    assert doc["images"][0]["stats"]["executables"] == 1


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("hello-darwin-amd64", "a macOS x86-64 executable (Mach-O): built with GOOS=darwin?"),
        ("hello-darwin-arm64", "a macOS arm64 executable (Mach-O): built with GOOS=darwin?"),
        ("hello-windows-amd64.exe", "a Windows x86-64 executable (PE): built with GOOS=windows?"),
        ("hello-freebsd-amd64", "a FreeBSD x86-64 executable (ELF): built with GOOS=freebsd?"),
        ("hello-openbsd-amd64", "an OpenBSD x86-64 executable (ELF): built with GOOS=openbsd?"),
    ],
)
def test_another_os_entrypoint_is_one_error_naming_os_and_arch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], foreign_os: dict[str, Path],
    name: str, said: str,
) -> None:  # fmt: skip
    code, doc = scan(tmp_path, capsys, entry_image(foreign_os[name].read_bytes()))
    assert code == 1, doc
    [finding] = doc["findings"]
    assert (finding["check"], finding["severity"], finding["entrypoint"]) == (
        "foreign-os", "error", True,
    )  # fmt: skip
    assert finding["message"] == f"{said} (it runs on no Linux node, of any architecture)"


def test_a_universal_mach_o_entrypoint_names_both_slices(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], foreign_os: dict[str, Path]
) -> None:
    fat = universal(*(foreign_os[f"hello-darwin-{a}"].read_bytes() for a in ("amd64", "arm64")))
    code, doc = scan(tmp_path, capsys, entry_image(fat))
    assert code == 1
    [finding] = doc["findings"]
    assert finding["check"] == "foreign-os"
    assert finding["message"].startswith("a macOS universal executable (Mach-O: x86-64 and arm64)")


def test_other_os_files_elsewhere_are_warnings_and_data_files_are_silent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], foreign_os: dict[str, Path],
    built: dict[str, Path],
) -> None:  # fmt: skip
    """The entrypoint runs; the image also carries a Windows .exe, a macOS build and an
    executable text file without #!: two warnings, exit 0 (1 with --fail-on warning)."""
    image = Image([[
        file("app/server", built["musl-static"].read_bytes()),
        file("dist/app.exe", foreign_os["hello-windows-amd64.exe"].read_bytes()),
        file("dist/app-darwin", foreign_os["hello-darwin-arm64"].read_bytes()),
        file("app/notes.txt", b"just data\n"),
        file("app/run-me", b"echo hi\n"),
    ]], entrypoint=["/app/server"])  # fmt: skip
    code, doc = scan(tmp_path, capsys, image)
    assert code == 0, doc
    assert {(f["check"], f["severity"], f["path"]) for f in doc["findings"]} == {
        ("foreign-os", "warning", "/dist/app.exe"),
        ("foreign-os", "warning", "/dist/app-darwin"),
    }
    assert not any(f.get("entrypoint") for f in doc["findings"])
    code, _ = scan(tmp_path / "strict", capsys, image, "--fail-on", "warning")
    assert code == 1


def test_an_image_whose_entrypoint_exists_is_never_nothing_to_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's image: /app/run.sh holding `echo hello`, mode 0755, nothing else."""
    image = Image([[file("app/run.sh", b"echo hello\n")]], entrypoint=["/app/run.sh"])
    code, doc = scan(tmp_path, capsys, image)
    assert code == 1 and [f["check"] for f in doc["findings"]] == ["missing-shebang"]
    assert doc["warnings"] == []


def test_the_first_program_of_sh_c_is_checked_and_a_missing_shebang_there_is_benign(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], foreign_os: dict[str, Path],
    built: dict[str, Path],
) -> None:  # fmt: skip
    """`sh -c 'exec /app/server'` starts a macOS build: an error. `sh -c /app/run.sh` of a
    script without #! is not: the shell retries it with /bin/sh."""
    layer = [
        file("bin/sh", built["musl-static"].read_bytes()),  # stands in for a static shell
        file("app/server", foreign_os["hello-darwin-amd64"].read_bytes()),
        file("app/run.sh", b"echo hello\n"),
    ]
    shell = ["/bin/sh", "-c"]
    code, doc = scan(
        tmp_path / "a", capsys, Image([layer], entrypoint=[*shell, "exec /app/server"])
    )
    assert code == 1
    [finding] = doc["findings"]
    assert (finding["check"], finding["path"], finding["entrypoint"]) == (
        "foreign-os", "/app/server", True,
    )  # fmt: skip
    code, doc = scan(tmp_path / "b", capsys, Image([layer], entrypoint=[*shell, "/app/run.sh"]))
    assert (code, doc["findings"][0]["path"]) == (0, "/app/server")  # a warning only
    assert [f["severity"] for f in doc["findings"]] == ["warning"]
