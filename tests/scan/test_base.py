"""`execwatch scan FILE|DIR --base IMAGE|DIR|ARCHIVE [--at PATH]`: a build's files checked
against the base they will run on, before the image exists, as if a COPY had placed them
at PATH (/app by default). A directory with no loader, /bin, /usr or /etc is a build's
output, not a root: without --base its files are checked one by one, and a note says so.

The bases are real: Debian bookworm's minbase root (dev/images.sh, .cache/images) and an
alpine-like musl root (Debian's musl loader); the program is a real gcc glibc build. With
--run the program is started in the sandbox, in the base image with it added at PATH.
The issue's own --base cases (musl base, Debian base, --run, ./dist without --base) are
in the table of tests/support/smoke/smoke_cases.py, run by tests/smoke/test_cases.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.binfmt.cbuild import HELLO_C, compile_c
from tests.support.images.base_images import MUSL_LOADER
from tests.support.images.imagebuild import Image, file, oci_layout
from tests.support.scan.scan_cli import checks, scan_error, scan_json

REPO = Path(__file__).resolve().parents[2]
DEBIAN_ROOTFS = REPO / ".cache" / "images" / "debian.rootfs.tar"
ENV_BASH = b"#!/usr/bin/env bash\necho hi\n"


@pytest.fixture(scope="module")
def debian() -> Path:
    if not DEBIAN_ROOTFS.exists():
        pytest.fail(f"{DEBIAN_ROOTFS} missing: run dev/setup.sh --test")
    return DEBIAN_ROOTFS


@pytest.fixture(scope="module")
def musl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An alpine-like image: musl's loader (which is its libc) and nothing of glibc."""
    layer = [file("lib/ld-musl-x86_64.so.1", MUSL_LOADER.resolve().read_bytes())]
    return oci_layout(tmp_path_factory.mktemp("musl") / "layout", [Image([layer])])


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The seed's oberon-runner: a dynamically linked glibc program."""
    return compile_c(tmp_path_factory.mktemp("build") / "oberon-runner", HELLO_C, "gcc")


@pytest.fixture
def dist(tmp_path: Path, program: Path) -> Path:
    """A build's output: a dynamic binary and a `#!/usr/bin/env bash` script."""
    d = tmp_path / "dist"
    d.mkdir()
    (d / "oberon-runner").write_bytes(program.read_bytes())
    (d / "oberon-runner").chmod(0o755)
    (d / "start.sh").write_bytes(ENV_BASH)
    (d / "start.sh").chmod(0o755)
    return d


def errors(doc: dict[str, Any]) -> set[tuple[str, str]]:
    return {(f["check"], f["path"]) for f in doc["findings"] if f["severity"] == "error"}


def test_a_glibc_program_on_a_musl_base_is_an_error_at_its_place(
    capsys: pytest.CaptureFixture[str], program: Path, musl: Path
) -> None:
    code, doc = scan_json(capsys, str(program), "--base", str(musl))
    assert code == 1
    [finding] = doc["findings"]
    assert (finding["check"], finding["path"]) == ("missing-interpreter", "/app/oberon-runner")
    assert finding["severity"] == "error" and finding["entrypoint"] is True
    assert "glibc binary in a musl image" in finding["message"]
    [image] = doc["images"]
    assert f"{program} placed at /app over " in image["notes"][0]


def test_root_takes_such_a_directory_as_a_root_filesystem(
    capsys: pytest.CaptureFixture[str], dist: Path
) -> None:
    code, doc = scan_json(capsys, str(dist), "--root")
    assert code == 1
    assert checks(doc) == {
        ("missing-interpreter", "/oberon-runner"),
        ("missing-shebang-interpreter", "/start.sh"),
    }


def test_a_directory_with_etc_is_a_root_filesystem(
    capsys: pytest.CaptureFixture[str], dist: Path
) -> None:
    (dist / "etc").mkdir()
    code, doc = scan_json(capsys, str(dist))
    assert code == 1
    assert ("missing-interpreter", "/oberon-runner") in checks(doc)


def test_a_build_output_on_a_debian_base_is_clean(
    capsys: pytest.CaptureFixture[str], dist: Path, debian: Path
) -> None:
    code, doc = scan_json(capsys, str(dist), "--base", str(debian))
    assert (code, doc["findings"]) == (0, [])  # Debian has the loader, env and bash on PATH
    assert doc["images"][0]["stats"]["executables"] == 2


def test_a_build_output_on_a_musl_base_names_each_missing_piece(
    capsys: pytest.CaptureFixture[str], dist: Path, musl: Path
) -> None:
    code, doc = scan_json(capsys, str(dist), "--base", str(musl), "--at", "/opt/oberon")
    assert code == 1
    assert errors(doc) == {
        ("missing-interpreter", "/opt/oberon/oberon-runner"),
        ("missing-shebang-interpreter", "/opt/oberon/start.sh"),
    }


def test_only_the_placed_files_are_checked_not_the_base(
    capsys: pytest.CaptureFixture[str], program: Path, debian: Path
) -> None:
    """Only the placed files are reported on: the base's own thousands of files are what
    they run on, not what the build changed."""
    code, doc = scan_json(capsys, str(program), "--base", str(debian))
    assert code == 0
    assert doc["images"][0]["stats"]["files"] == 1


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--base", "/nonexistent/base"], "--base /nonexistent/base: No such file or directory"),
        (["--at", "app"], "--at app: not an absolute path"),
        (["--root"], "--root with --base"),
        (["--run", "--base", str(DEBIAN_ROOTFS)], "needs an image to run in"),
    ],
)
def test_bad_base_input_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], program: Path, musl: Path, extra: list[str], says: str
) -> None:
    argv = [str(program), *(["--base", str(musl)] if "--base" not in extra else []), *extra]
    assert says in scan_error(capsys, *argv)


def test_run_with_base_starts_one_program_not_a_directory(
    capsys: pytest.CaptureFixture[str], dist: Path, musl: Path
) -> None:
    error = scan_error(capsys, str(dist), "--base", str(musl), "--run")
    assert "give the one program to start" in error
