"""The loader's own words, from real builds: a run names MissingLibrary and
MissingSymbolVersion as the static checks do, and each report format carries `source: run`;
a kernel that refuses the sandbox's user namespace gets one line naming the sysctl."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.smoke.conftest import execwatch_scan, runs
from tests.support.binfmt.cbuild import compile_c
from tests.support.images.base_images import glibc_base, host_glibc
from tests.support.images.imagebuild import Entry, Image, file, oci_layout, symlink

LIBFOO_C = "int foo(void) { return 1; }\nint foo2(void) { return 2; }\n"
MAPS = {
    "new": "FOO_1.0 { global: foo; local: *; };\nFOO_2.0 { global: foo2; } FOO_1.0;\n",
    "old": "FOO_1.0 { global: foo; foo2; local: *; };\n",
}
USES_FOO_C = "int foo2(void);\nint main(void) { return foo2(); }\n"


@pytest.fixture(scope="module")
def libfoo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """uses-foo needs foo2@FOO_2.0 of libfoo.so.1; the old libfoo defines FOO_1.0 only."""
    d = tmp_path_factory.mktemp("libfoo")
    out = {}
    for name, script in MAPS.items():
        (d / name).mkdir()
        (d / f"{name}.map").write_text(script)
        flags = (
            "-shared",
            "-fPIC",
            "-Wl,-soname,libfoo.so.1",
            f"-Wl,--version-script={d}/{name}.map",
        )
        out[name] = compile_c(d / name / "libfoo.so.1", LIBFOO_C, "gcc", *flags)
        (d / name / "libfoo.so").symlink_to("libfoo.so.1")
    out["uses-foo"] = compile_c(d / "uses-foo", USES_FOO_C, "gcc", f"-L{d / 'new'}", "-lfoo")
    return out


def image(libfoo: dict[str, Path], lib: str | None) -> Image:
    uses_foo = file("app/uses-foo", libfoo["uses-foo"].read_bytes())
    layer: list[Entry] = [*glibc_base(host_glibc()), uses_foo]
    if lib:
        layer.append(file("usr/lib/x86_64-linux-gnu/libfoo.so.1", libfoo[lib].read_bytes()))
    return Image([layer], entrypoint=["/app/uses-foo"])


@pytest.mark.parametrize(
    ("lib", "check"),
    [(None, "missing-library"), ("old", "missing-symbol-version"), ("new", "run-started")],
)
def test_the_loaders_words_become_the_same_checks(
    libfoo: dict[str, Path], shared_dir: Path, lib: str | None, check: str
) -> None:
    layout = oci_layout(shared_dir / "img", [image(libfoo, lib)])
    _, doc, err = execwatch_scan(str(layout), "--run")
    [run] = runs(doc)
    assert run["check"] == check, run["message"]
    static = {
        f["check"] for f in doc["findings"] if f["source"] == "static" and f["severity"] == "error"
    }
    assert static == (set() if lib == "new" else {check}), err
    assert "disagreement" not in run


def test_sarif_junit_and_the_table_carry_the_run(
    libfoo: dict[str, Path], shared_dir: Path, tmp_path: Path
) -> None:
    layout = oci_layout(shared_dir / "img", [image(libfoo, None)])
    sarif = json.loads(subprocess.run(
        [sys.executable, "-m", "execwatch.cli", "scan", str(layout), "--run", "--format", "sarif"],
        capture_output=True, text=True, check=False).stdout)  # fmt: skip
    results = sarif["runs"][0]["results"]
    assert {r["properties"]["source"] for r in results} == {"static", "run"}
    junit = subprocess.run(
        [sys.executable, "-m", "execwatch.cli", "scan", str(layout), "--run", "--format", "junit"],
        capture_output=True, text=True, check=False).stdout  # fmt: skip
    assert "run: exit 127: the loader says: error while loading shared libraries" in junit
    table = subprocess.run(
        [sys.executable, "-m", "execwatch.cli", "scan", str(layout), "--run", "--no-progress"],
        capture_output=True, text=True, check=False,
        env={**os.environ, "COLUMNS": "300"}).stdout  # fmt: skip
    assert "missing-library" in table and "run: exit 127: the loader says" in table


def test_a_refused_user_namespace_is_one_line_naming_the_sysctl(
    libfoo: dict[str, Path], shared_dir: Path
) -> None:
    """user.max_user_namespaces = 0, set in a user namespace of the test's own."""
    layout = oci_layout(shared_dir / "img", [image(libfoo, "new")])
    script = (
        "echo 0 > /proc/sys/user/max_user_namespaces && exec "
        f"{sys.executable} -m execwatch.cli scan --no-progress {layout} --run"
    )
    proc = subprocess.run(
        ["unshare", "-Ur", "sh", "-c", script], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 2
    assert proc.stderr == (
        "execwatch scan: error: unprivileged user namespaces are refused here"
        " (user.max_user_namespaces = 0): cannot run\n"
    )


CXX_C = (
    "#include <iostream>\n#include <string>\n"
    'thread_local std::string s = "hi";\n'
    "int main() { std::cout << s << std::endl; return 0; }\n"
)


def test_a_glibc_cxx_program_on_gcompat_style_musl_is_libc_mismatch(
    shared_dir: Path, tmp_path: Path
) -> None:
    """musl's loader in ld-linux's place, as gcompat installs it: the glibc C++ program's
    libstdc++ asks musl for glibc-only symbols (FACTS.md: `Error relocating`, 127)."""
    program = compile_c(tmp_path / "cxx", CXX_C, "g++")
    musl = Path("/lib/ld-musl-x86_64.so.1").resolve().read_bytes()
    libs = [file(f"usr/lib/{name}", Path(f"/lib/x86_64-linux-gnu/{name}").resolve().read_bytes())
            for name in ("libstdc++.so.6", "libgcc_s.so.1")]  # fmt: skip
    layer = [file("lib/ld-musl-x86_64.so.1", musl),
             symlink("lib64/ld-linux-x86-64.so.2", "/lib/ld-musl-x86_64.so.1"),
             *libs, file("app/cxx", program.read_bytes())]  # fmt: skip
    layout = oci_layout(shared_dir / "img", [Image([layer], entrypoint=["/app/cxx"])])
    code, doc, err = execwatch_scan(str(layout), "--run")
    assert code == 1, err
    [run] = runs(doc)
    assert run["check"] == "libc-mismatch", run["message"]
    assert "Error relocating" in run["message"]
    assert run["disagreement"].startswith("the static side says it runs")  # gcompat hides it


def test_root_of_a_user_namespace_without_65534_runs_as_itself(
    libfoo: dict[str, Path], shared_dir: Path
) -> None:
    """A rootless container's root (here `unshare -Ur`: only uid 0 mapped) cannot drop to
    65534 and needs not: it is no one outside. The run nests its namespaces in that one."""
    layout = oci_layout(shared_dir / "img", [image(libfoo, "new")])
    script = (
        f"exec {sys.executable} -m execwatch.cli scan --no-progress {layout} --run --format json"
    )
    proc = subprocess.run(
        ["unshare", "-Ur", "sh", "-c", script], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    [run] = runs(json.loads(proc.stdout))
    assert run["check"] == "run-started"
