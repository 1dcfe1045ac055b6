"""A registry that lies: digests that are paths, blobs longer than their descriptors
declare, bytes dripped one by one. The scan refuses each with one line, reads no more
than the descriptor allows, and touches nothing outside its cache."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest

from execwatch.binfmt import Platform
from execwatch.runnable.limits import Limits
from execwatch.scan.errors import ScanInputError
from execwatch.scan.registry import RegistryOptions
from execwatch.scan.runner import ScanOptions, scan
from tests.support.images.imagebuild import Image, file, layer_tar, oci_layout
from tests.support.registry.registry_server import Blob, HostileRegistry, Registry
from tests.support.scan.scan_cli import scan_error

TAR = "application/vnd.oci.image.layer.v1.tar"
LONG_AGO = 946684800  # 2000-01-01


def args(registry: HostileRegistry, cache: Path, *more: str) -> list[str]:
    return ["--insecure-registry", registry.host, "--cache-dir", str(cache), *more]


def config() -> dict[str, object]:
    return Image([], entrypoint=["/bin/run"]).config()


def test_a_layer_digest_that_is_a_path_never_reaches_the_file_system(
    hostile: HostileRegistry, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 24: `sha256:../…/dev/zero` became a cache path: 26.9 GB read in 20 s and a
    utime() on the file reached. Here the file reached is one of the test's: it is neither
    opened as a layer nor touched, and no request names the digest."""
    outside = tmp_path / "outside"
    outside.write_bytes(layer_tar([file("bin/run", b"#!/bin/sh\n")]))
    os.utime(outside, (LONG_AGO, LONG_AGO))
    digest = "sha256:" + "../" * 40 + str(outside).lstrip("/")
    layer = {"mediaType": TAR, "digest": digest, "size": outside.stat().st_size}
    ref = hostile.image("team/escape:1", config(), [layer])
    message = scan_error(capsys, ref, *args(hostile, tmp_path / "cache"))
    assert "invalid digest 'sha256:../../" in message
    assert outside.stat().st_mtime == LONG_AGO
    assert not [p for p in hostile.requested if ".." in p or "outside" in p]


@pytest.mark.parametrize(
    ("length", "expected"),
    [
        (False, "is larger than the 100 bytes its descriptor declares"),
        (True, "is 67108864 bytes, its descriptor says 100"),
    ],
)
def test_a_blob_longer_than_its_descriptor_declares_is_cut_short(
    hostile: HostileRegistry,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    length: bool,
    expected: str,
) -> None:
    """Issue 24: a layer declared as 100 bytes wrote more than 2.16 GB into the cache's
    .part file despite --cache-size 1M. The stream stops at the 101st byte (or before the
    first, when the registry announces its length), and nothing is left in the cache."""
    body = bytes(1 << 20)
    digest = "sha256:" + hashlib.sha256(body[:100]).hexdigest()
    hostile.blobs[digest] = Blob(body, repeat=64, length=length)  # 64 MiB, 100 declared
    ref = hostile.image(
        "team/long:1", config(), [{"mediaType": TAR, "digest": digest, "size": 100}]
    )
    cache = tmp_path / "cache"
    message = scan_error(capsys, ref, *args(hostile, cache, "--cache-size", "1M"))
    assert expected in message
    assert hostile.sent.get(digest, 0) < 16 << 20  # the client hung up: not 64 MiB
    left = {p.name for p in cache.rglob("*") if p.is_file()}  # the config, verified
    assert digest[7:] not in left and not [n for n in left if n.startswith(".part")], left


def test_a_registry_that_drips_bytes_meets_the_image_deadline(
    hostile: HostileRegistry, tmp_path: Path
) -> None:
    body = layer_tar([file("bin/run", b"#!/bin/sh\n" * 1000)])
    layer = hostile.blob(body, TAR)
    hostile.blobs[layer["digest"]] = Blob(body[:1], repeat=len(body), delay=0.02)  # 1 B / 20 ms
    ref = hostile.image("team/slow:1", config(), [layer])
    options = ScanOptions(
        platforms=(Platform.parse("linux/amd64"),),
        limits=Limits(max_image_seconds=1.0),
        registry=RegistryOptions(insecure=frozenset({hostile.host}), cache_dir=str(tmp_path)),
    )
    started = time.monotonic()
    with pytest.raises(ScanInputError, match=r"within 1 s|deadline passed"):
        scan(ref, options)
    assert time.monotonic() - started < 10


def test_the_real_registry_serving_a_layer_its_manifest_says_is_100_bytes(
    registry: Registry, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The distribution registry checks that a pushed manifest's blobs exist, not their
    sizes: a manifest that declares a 1 MiB layer as 100 bytes is accepted and served. The
    scan refuses it from the registry's Content-Length, before reading the body."""
    image = Image([[file("bin/run", os.urandom(1 << 20))]], compression="none")
    registry.push(oci_layout(tmp_path / "layout", [image]), "team/liar:real")
    manifest = registry.manifest("team/liar:real")
    assert manifest["layers"][0]["size"] > 1 << 20
    manifest["layers"][0]["size"] = 100
    registry.manifest("team/liar:lie", put=manifest)
    ref = f"{registry.host}/team/liar:lie"
    auth = registry.auth_file(tmp_path / "auth.json")
    cache = tmp_path / "cache"
    argv = ["--registry-config", str(auth), "--registry-ca", str(registry.ca)]
    message = scan_error(capsys, ref, *argv, "--cache-dir", str(cache), "--cache-size", "1M")
    assert "its descriptor says 100" in message
    assert not [p for p in cache.rglob("*") if p.name.startswith(".part")]
