"""The smallest real roots an image starts from: a Debian-like glibc root and an
Alpine-like musl root, from the host's own loader and libc (the `host_glibc`/`host_musl`
fixtures' bytes)."""

from __future__ import annotations

from pathlib import Path

from tests.support.images.imagebuild import Entry, directory, file, symlink

MUSL_LOADER = Path("/lib/ld-musl-x86_64.so.1")


def host_glibc() -> dict[str, bytes]:
    """The host's glibc loader and libc, to make small amd64 glibc images."""
    loader = Path("/lib64/ld-linux-x86-64.so.2").resolve()
    libc = Path("/lib/x86_64-linux-gnu/libc.so.6").resolve()
    return {"loader": loader.read_bytes(), "libc": libc.read_bytes()}


def glibc_base(host_glibc: dict[str, bytes]) -> list[Entry]:
    """A Debian-like glibc root: the loader via the /lib64 symlink, libc in the multiarch dir."""
    return [
        directory("usr/lib/x86_64-linux-gnu"),
        file("usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2", host_glibc["loader"]),
        file("usr/lib/x86_64-linux-gnu/libc.so.6", host_glibc["libc"], 0o644),
        directory("usr/lib64"),
        symlink("usr/lib64/ld-linux-x86-64.so.2", "../lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"),
        symlink("lib", "usr/lib"),
        symlink("lib64", "usr/lib64"),
        symlink("bin", "usr/bin"),
    ]


def musl_base(host_musl: bytes) -> list[Entry]:
    """An Alpine-like root: musl's loader is its libc."""
    return [
        file("lib/ld-musl-x86_64.so.1", host_musl),
        symlink("lib/libc.musl-x86_64.so.1", "ld-musl-x86_64.so.1"),
    ]
