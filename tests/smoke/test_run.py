"""`execwatch scan IMAGE --run`: each platform's entrypoint started in the sandbox, its
outcome a finding with `source: run`, in the same vocabulary as the static checks. The
issue's cases are test_cases.py's (one table with the oldest guest kernel's test)."""

from __future__ import annotations

from pathlib import Path

from tests.smoke.conftest import execwatch_scan, runs
from tests.support.binfmt.cbuild import HELLO_C, compile_c
from tests.support.images.imagebuild import Image, file, oci_layout
from tests.support.kernels.vm import Kernel


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
