"""Real binaries built on this machine: glibc and musl, dynamic, static and static-pie."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.binfmt.cbuild import HELLO_C, compile_c

LIBFOO_C = "int foo(void) { return 1; }\nint foo2(void) { return 2; }\n"
LIBFOO_MAP = "FOO_1.0 { global: foo; local: *; };\nFOO_2.0 { global: foo2; } FOO_1.0;\n"
USES_FOO_C = "int foo2(void);\nint main(void) { return foo2(); }\n"


@pytest.fixture(scope="session")
def host_binaries(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("host-bin")
    (d / "libfoo.map").write_text(LIBFOO_MAP)
    lib_flags = ["-shared", "-fPIC", "-Wl,-soname,libfoo.so.1"]
    lib_flags.append(f"-Wl,--version-script={d / 'libfoo.map'}")
    compile_c(d / "libfoo.so.1", LIBFOO_C, "gcc", *lib_flags)
    (d / "libfoo.so").symlink_to("libfoo.so.1")
    rpath = ["-Wl,-rpath,$ORIGIN/../lib:/opt/foo", "-Wl,--disable-new-dtags"]
    return {
        "glibc": compile_c(d / "glibc", HELLO_C, "gcc"),
        "glibc-static": compile_c(d / "glibc-static", HELLO_C, "gcc", "-static"),
        "glibc-static-pie": compile_c(d / "glibc-static-pie", HELLO_C, "gcc", "-static-pie"),
        "musl": compile_c(d / "musl", HELLO_C, "musl-gcc"),
        "musl-static": compile_c(d / "musl-static", HELLO_C, "musl-gcc", "-static"),
        "libfoo": d / "libfoo.so.1",
        "uses-foo": compile_c(d / "uses-foo", USES_FOO_C, "gcc", f"-L{d}", "-lfoo", *rpath),
    }
