"""`execwatch scan IMAGE --run`: each platform's entrypoint started in the sandbox, its
outcome a finding with `source: run`, in the same vocabulary as the static checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.smoke.conftest import ARM64_ROOT, EMULATORS, NOBODY, execwatch_scan, runs
from tests.support.binfmt.cbuild import HELLO_C, compile_c
from tests.support.images.imagebuild import Entry, Image, file, oci_layout, tree, usrmerge
from tests.support.kernels.vm import Kernel

MUSL_LOADER = Path("/lib/ld-musl-x86_64.so.1")
AS = {"root": None, "nobody": NOBODY}


def glibc_base() -> list[Entry]:
    loader = Path("/lib64/ld-linux-x86-64.so.2").resolve().read_bytes()
    libc = Path("/lib/x86_64-linux-gnu/libc.so.6").resolve().read_bytes()
    return [
        file("lib64/ld-linux-x86-64.so.2", loader),
        file("lib/x86_64-linux-gnu/libc.so.6", libc),
    ]


@pytest.mark.parametrize("who", AS)
def test_glibc_program_on_musl_is_missing_interpreter_static_and_run(
    programs: dict[str, Path], shared_dir: Path, who: str
) -> None:
    layer = [file("lib/ld-musl-x86_64.so.1", MUSL_LOADER.resolve().read_bytes()),
             file("app/hello", programs["glibc"].read_bytes())]  # fmt: skip
    layout = oci_layout(shared_dir / "img", [Image([layer], entrypoint=["/app/hello"])])
    code, doc, err = execwatch_scan(str(layout), "--run", user=AS[who])
    assert code == 1, err
    static = {f["check"] for f in doc["findings"] if f["source"] == "static"}
    assert static == {"libc-mismatch"}  # the static rules name the cause: a glibc program on musl
    [run] = runs(doc)
    assert (run["check"], run["severity"], run["path"]) == (
        "missing-interpreter",
        "error",
        "/app/hello",
    )
    assert "disagreement" not in run


def test_a_constructor_crash_is_startup_crash_and_the_disagreement_is_named(
    programs: dict[str, Path], shared_dir: Path
) -> None:
    layer = [*glibc_base(), file("app/crash", programs["crash"].read_bytes())]
    layout = oci_layout(shared_dir / "img", [Image([layer], entrypoint=["/app/crash"])])
    code, doc, err = execwatch_scan(str(layout), "--run")
    assert code == 1, err
    assert [
        f for f in doc["findings"] if f["source"] == "static" and f["severity"] == "error"
    ] == []
    [run] = runs(doc)
    assert run["check"] == "startup-crash"
    assert "SIGSEGV" in run["message"]
    assert "static side says it runs" in run["disagreement"]


def arm64_image(entrypoint: list[str], extra: list[Entry] | None = None) -> Image:
    layer = [*tree(ARM64_ROOT), *usrmerge(ARM64_ROOT), *(extra or [])]
    return Image([layer], architecture="arm64", entrypoint=entrypoint)


@pytest.mark.parametrize("qemu", ["binfmt_misc", "direct"])
def test_an_honest_multi_arch_image_starts_on_both_platforms(
    programs: dict[str, Path], shared_dir: Path, qemu: str
) -> None:
    amd64 = Image([[file("hello", programs["musl-static"].read_bytes())]], entrypoint=["/hello"])
    layout = oci_layout(shared_dir / "img", [amd64, arm64_image(["/usr/bin/hello"])])
    env = {"EXECWATCH_RUN_QEMU": "direct"} if qemu == "direct" else {}
    code, doc, err = execwatch_scan(str(layout), "--run", "--qemu-dir", str(EMULATORS), env=env)
    assert code == 0, err
    by_platform = {f["platform"]: f for f in runs(doc)}
    assert set(by_platform) == {"linux/amd64", "linux/arm64"}
    assert {f["check"] for f in by_platform.values()} == {"run-started"}
    assert "QEMU" not in by_platform["linux/amd64"]["message"]
    assert f"under QEMU ({qemu})" in by_platform["linux/arm64"]["message"]


def test_an_arm64_entry_holding_x86_64_binaries_is_an_exec_format_error(
    programs: dict[str, Path], shared_dir: Path
) -> None:
    wrong = Image([[file("hello", programs["musl-static"].read_bytes())]],
                  architecture="arm64", entrypoint=["/hello"])  # fmt: skip
    amd64 = Image([[file("hello", programs["musl-static"].read_bytes())]], entrypoint=["/hello"])
    layout = oci_layout(shared_dir / "img", [amd64, wrong])
    code, doc, err = execwatch_scan(str(layout), "--run", "--qemu-dir", str(EMULATORS))
    assert code == 1, err
    by_platform = {f["platform"]: f for f in runs(doc)}
    assert by_platform["linux/amd64"]["check"] == "run-started"
    assert by_platform["linux/arm64"]["check"] == "arch-mismatch"
    assert "Exec format error" in by_platform["linux/arm64"]["message"]


def test_no_entrypoint_and_no_image_is_one_line_and_exit_2(shared_dir: Path) -> None:
    code, _, err = execwatch_scan("/bin/true", "--run")
    assert code == 2
    assert err.count("\n") == 1 and "--run needs an image" in err


def test_a_run_that_starts_despite_a_static_error_is_named(
    shared_dir: Path, tmp_path: Path
) -> None:
    """A program marked x86-64-v3 that uses no v3 instruction, checked against
    --cpu-level x86-64-v2 nodes: an error for the static side (the marker says so); the run,
    in a microVM whose CPU is v2 (Nehalem), starts, as musl's loader checks no marker and
    the code needs nothing v2 lacks. The report says both."""
    program = compile_c(tmp_path / "v3", HELLO_C, "musl-gcc", "-static", "-Wl,-z,x86-64-v3")
    image = Image([[file("v3", program.read_bytes())]], entrypoint=["/v3"])
    layout = oci_layout(shared_dir / "img", [image])
    kernel = str(Kernel.fetched("bullseye").vmlinuz)
    code, doc, err = execwatch_scan(
        str(layout), "--run", "--cpu-level", "x86-64-v2", "--vm-kernel", kernel
    )
    assert code == 1, err
    static = {(f["check"], f["severity"]) for f in doc["findings"] if f["source"] == "static"}
    assert static == {("cpu-level", "error")}
    [run] = runs(doc)
    assert run["check"] == "run-started"
    assert run["message"].startswith("run under QEMU system (Nehalem): started: exit 0")
    assert run["disagreement"] == "the static side said cpu-level but it started"
