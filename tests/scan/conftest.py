"""Binaries for scan tests: host gcc and musl-gcc builds, and real Debian foreign roots."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.binfmt.cbuild import HELLO_C, compile_c
from tests.support.images import base_images

LIBFOO_C = (
    "int foo(void) { return 1; }\nint foo2(void) { return 2; }\nint foo3(void) { return 3; }\n"
)
MAPS = {
    "v1": "FOO_1.0 { global: foo; local: *; };\n",
    "v12": "FOO_1.0 { global: foo; local: *; };\nFOO_2.0 { global: foo2; } FOO_1.0;\n",
    "v13": "FOO_1.0 { global: foo; local: *; };\nFOO_3.0 { global: foo2; foo3; } FOO_1.0;\n",
}
USES_FOO_C = "int foo2(void);\nint main(void) { return foo2(); }\n"


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """hello (glibc, musl, static, static-pie), libfoo in three version sets, its users."""
    d = tmp_path_factory.mktemp("scan-bin")
    out = {
        "glibc": compile_c(d / "hello-glibc", HELLO_C, "gcc"),
        "glibc-static-pie": compile_c(d / "hello-static-pie", HELLO_C, "gcc", "-static-pie"),
        "musl": compile_c(d / "hello-musl", HELLO_C, "musl-gcc"),
        "musl-static": compile_c(d / "hello-musl-static", HELLO_C, "musl-gcc", "-static"),
    }
    for name, version_map in MAPS.items():
        (d / f"{name}.map").write_text(version_map)
        lib_dir = d / name
        lib_dir.mkdir()
        flags = [
            "-shared",
            "-fPIC",
            "-Wl,-soname,libfoo.so.1",
            f"-Wl,--version-script={d / name}.map",
        ]
        out[f"libfoo-{name}"] = compile_c(lib_dir / "libfoo.so.1", LIBFOO_C, "gcc", *flags)
        (lib_dir / "libfoo.so").symlink_to("libfoo.so.1")
    v12 = d / "v12"
    out["uses-foo"] = compile_c(d / "uses-foo", USES_FOO_C, "gcc", f"-L{v12}", "-lfoo")
    out["uses-foo-origin"] = compile_c(
        d / "uses-foo-origin", USES_FOO_C, "gcc", f"-L{v12}", "-lfoo",
        "-Wl,-rpath,$ORIGIN/../lib/foo", "-Wl,--enable-new-dtags",
    )  # fmt: skip
    musl_lib = d / "musl-lib"
    musl_lib.mkdir()
    out["libfoo-musl"] = compile_c(musl_lib / "libfoo.so.1", LIBFOO_C, "musl-gcc",
                                   "-shared", "-fPIC", "-Wl,-soname,libfoo.so.1")  # fmt: skip
    (musl_lib / "libfoo.so").symlink_to("libfoo.so.1")
    out["uses-foo-musl"] = compile_c(
        d / "uses-foo-musl", USES_FOO_C, "musl-gcc", f"-L{musl_lib}", "-lfoo"
    )
    return out


@pytest.fixture(scope="session")
def host_glibc() -> dict[str, bytes]:
    """The host's glibc loader and libc, to make small amd64 glibc images."""
    return base_images.host_glibc()


@pytest.fixture(scope="session")
def host_musl() -> bytes:
    """Debian's musl loader (which is also musl's libc)."""
    path = base_images.MUSL_LOADER
    if not path.exists():
        pytest.fail("musl is not installed: run dev/setup.sh --test")
    return path.resolve().read_bytes()
