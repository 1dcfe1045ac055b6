"""pytest fixtures over server.py: one registry per session, the suite's images pushed once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.images.base_images import glibc_base, musl_base
from tests.support.images.imagebuild import Image, file, oci_layout, symlink, tree, usrmerge
from tests.support.registry.registry_server import (
    HostileRegistry,
    Registry,
    registry_binary,
    running_registry,
)


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    try:
        registry_binary()
    except FileNotFoundError as exc:
        pytest.fail(str(exc), pytrace=False)
    with running_registry(tmp_path_factory.mktemp("registry")) as reg:
        yield reg


def arm64_root(foreign_root: Path) -> list:  # type: ignore[type-arg]
    root = foreign_root / "arm64" / "root"
    return tree(root) + usrmerge(root)


@pytest.fixture(scope="session")
def pushed(
    registry: Registry,
    tmp_path_factory: pytest.TempPathFactory,
    foreign_root: Path,
    built: dict[str, Path],
    host_musl: bytes,
    host_glibc: dict[str, bytes],
) -> dict[str, str]:
    """References of the scan suite's cases, pushed with skopeo.

    multi: an index of arm64 and arm/v7 Debian roots and a "riscv64" entry that carries the
    arm64 root (the bad platform); all three share one top layer with a static-file tree.
    musl: a glibc binary on a musl image, pushed as Docker v2 schema 2 media types.
    whiteout: an arm64 root whose second layer deletes the loader.
    hello: amd64 (host glibc and gcc's hello) and arm64 (Debian's hello), both ready.
    ready: arm64 only, ready.
    """
    d = tmp_path_factory.mktemp("push")
    shared = [file("etc/app/config.txt", b"shared across platforms\n", 0o644)]
    armhf = foreign_root / "armhf" / "root"
    entry = ["/usr/bin/hello"]
    zstd = {"entrypoint": entry, "compression": "zstd"}  # reproducible: no gzip timestamp
    multi = [
        Image([arm64_root(foreign_root), shared], "arm64", **zstd),  # type: ignore[arg-type]
        Image([tree(armhf) + usrmerge(armhf), shared], "arm", variant="v7", **zstd),  # type: ignore[arg-type]
        Image([arm64_root(foreign_root), shared], "riscv64", **zstd),  # type: ignore[arg-type]
    ]
    glibc_on_musl = Image(
        [musl_base(host_musl), [file("app", built["glibc"].read_bytes())]], entrypoint=["/app"]
    )
    loader = [file("usr/lib/.wh.ld-linux-aarch64.so.1", b"", 0o644)]
    whiteout = Image([arm64_root(foreign_root), loader], "arm64", entrypoint=entry)
    amd64 = Image(
        [glibc_base(host_glibc), [file("usr/bin/hello", built["glibc"].read_bytes())]],
        entrypoint=entry,
    )
    hello = [amd64, Image([arm64_root(foreign_root)], "arm64", entrypoint=entry)]
    link = [symlink("usr/local/bin/hello", "/usr/bin/hello")]
    return {
        "multi": registry.push(oci_layout(d / "multi", multi), "team/multi:1.0", ref="test:latest"),
        "musl": registry.push(oci_layout(d / "musl", [glibc_on_musl]), "team/musl:1", v2s2=True),
        "hello": registry.push(oci_layout(d / "hello", hello), "team/hello:2", ref="test:latest"),
        "whiteout": registry.push(oci_layout(d / "wh", [whiteout]), "team/whiteout:1"),
        "ready": registry.push(
            oci_layout(
                d / "ready", [Image([arm64_root(foreign_root), link], "arm64", entrypoint=entry)]
            ),
            "team/ready:1",
        ),
    }


@pytest.fixture
def hostile() -> Iterator[HostileRegistry]:
    """A registry that serves whatever the test gives it (server.HostileRegistry)."""
    registry = HostileRegistry()
    try:
        yield registry
    finally:
        registry.close()
