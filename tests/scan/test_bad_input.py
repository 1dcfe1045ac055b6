"""`execwatch scan` never lies about bad input: a broken artifact is exit 2 with one line,
never a traceback and never "no findings"; findings say which image they belong to."""

from __future__ import annotations

import gzip
import io
import json
import os
import random
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import pytest
import zstandard

from execwatch.scan.errors import CorruptInput, NothingToCheck
from execwatch.scan.runner import ScanOptions, scan
from tests.support.images.imagebuild import (
    Image,
    docker25_archive,
    file,
    layer_tar,
    legacy_docker_archive,
    oci_layout,
    tar_directory,
)
from tests.support.scan.scan_cli import run, scan_error, scan_json

ELF_PLACEHOLDER = b"#!/bin/sh\n"


def image(**kwargs: Any) -> Image:
    return Image([[file("bin/sh", b"\x7fELF-not-really"), file("app/run", b"#!/bin/zsh\n")]],
                 entrypoint=["/app/run"], **kwargs)  # fmt: skip


def truncated(path: Path, keep: float = 0.5) -> Path:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    return path


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_truncated_docker_save_is_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], compression: str
) -> None:
    archive = docker25_archive(tmp_path / "w", image(compression="none"), tmp_path / "i.tar")
    if compression == "gzip":
        archive.write_bytes(gzip.compress(archive.read_bytes()))
    message = scan_error(capsys, str(truncated(archive)))
    assert "truncated or corrupt archive" in message


def test_truncated_oci_tarball_is_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    layout = oci_layout(tmp_path / "l", [image(compression="none")])
    archive = tar_directory(layout, tmp_path / "oci.tar")
    message = scan_error(capsys, str(truncated(archive, 0.5)))
    assert "truncated or corrupt archive" in message


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_truncated_rootfs_tarball_is_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], compression: str
) -> None:
    data = layer_tar([file(f"bin/tool{i}", os.urandom(3000)) for i in range(20)])
    if compression == "gzip":
        data = gzip.compress(data)
    rootfs = tmp_path / "rootfs.tar"
    rootfs.write_bytes(data[: len(data) // 2])
    message = scan_error(capsys, str(rootfs))
    assert "truncated or corrupt" in message or "corrupt layer" in message


def test_random_bytes_named_like_an_archive(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    junk = tmp_path / "junk.tar"
    junk.write_bytes(random.Random(4).randbytes(4096))
    assert "named like an archive but is not a tar" in scan_error(capsys, str(junk))


def test_random_bytes_under_any_name_are_nothing_to_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    junk = tmp_path / "junk"
    junk.write_bytes(random.Random(5).randbytes(4096))
    message = scan_error(capsys, str(junk))
    assert "nothing to check: no executable in" in message
    assert "--allow-empty" in message


def test_a_tree_without_executables_is_an_error_unless_allowed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc/hostname").write_text("box\n")
    assert "nothing to check" in scan_error(capsys, str(root))
    capsys.readouterr()
    assert run([str(root), "--allow-empty"]) == 0
    err = capsys.readouterr().err
    assert f"execwatch scan: warning: nothing to check: no executable in {root}" in err


def test_error_kinds_are_told_apart(tmp_path: Path) -> None:
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"\x1f\x8b\x08\x00" + bytes(200))
    with pytest.raises(CorruptInput):
        scan(str(junk), ScanOptions())
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(NothingToCheck):
        scan(str(empty), ScanOptions())


def test_findings_name_their_image_among_several(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two images in one layout, the same broken file in both: which image is which."""
    layout = oci_layout(tmp_path / "l", [image(), image(architecture="arm64")])
    code, doc = scan_json(capsys, str(layout))
    assert code == 1
    index = json.loads((layout / "index.json").read_text())
    inner = json.loads((layout / "blobs/sha256" / index["manifests"][0]["digest"][7:]).read_text())
    digests = {m["digest"]: m["platform"]["architecture"] for m in inner["manifests"]}
    images = {(i["platform"], i["digest"]) for i in doc["images"]}
    assert images == {(f"linux/{arch}", d) for d, arch in digests.items()}
    for finding in doc["findings"]:
        identity = finding["image"]
        assert identity["digest"] in digests
        assert identity["platform"] == f"linux/{digests[identity['digest']]}"
        assert identity["source"].endswith("@" + identity["digest"][:19])


def test_sarif_fingerprints_are_unique(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two images with the same findings, and one binary missing two libraries."""
    from tests.support.binfmt.elfbuild import ElfSpec, build_elf

    app = build_elf(ElfSpec(elf_type=2, needed=["liba.so", "libb.so"])).data
    layers = [[file("app/bin", app), file("lib64/ld-linux-x86-64.so.2",
                                         build_elf(ElfSpec(interpreter=None)).data)]]  # fmt: skip
    images = [Image(layers, entrypoint=["/app/bin"]), Image(layers, "arm64", entrypoint=["/x"])]
    layout = oci_layout(tmp_path / "l", images)
    out = tmp_path / "r.sarif"
    assert run([str(layout), "--format", "sarif", "-o", str(out)]) == 1
    results = json.loads(out.read_text())["runs"][0]["results"]
    prints = [r["partialFingerprints"]["execwatch/v2"] for r in results]
    missing = [r for r in results if r["ruleId"] == "missing-library"]
    assert len(missing) == 2
    assert len(results) >= 4 and len(set(prints)) == len(prints), prints
    assert {r["properties"]["image"]["platform"] for r in results} == {"linux/amd64", "linux/arm64"}


def test_a_compressed_rootfs_is_streamed_not_spooled(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    data = gzip.compress(layer_tar([file("bin/run", b"#!/bin/sh\n"), file("bin/sh", b"#!x\n")]))
    rootfs = tmp_path / "rootfs.tar.gz"
    rootfs.write_bytes(data)

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a temporary file was opened")

    monkeypatch.setattr(tempfile, "TemporaryFile", refuse)
    code, doc = scan_json(capsys, str(rootfs), "--platform", "linux/amd64")
    assert code == 1, doc
    assert {f["path"] for f in doc["findings"]} == {"/bin/sh"}  # "#!x": no interpreter x


def reverse_layers(archive: Path) -> None:
    """Rewrite a docker-save archive with its layer blobs first, last layer first."""
    with tarfile.open(archive) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]  # type: ignore[union-attr]
    manifest = json.loads(next(d for m, d in members if m.name == "manifest.json"))
    rank = {name: i for i, name in enumerate(reversed(manifest[0]["Layers"]))}
    members.sort(key=lambda md: rank.get(md[0].name, len(rank)))
    assert [m.name for m, _ in members[:3]] == manifest[0]["Layers"][::-1]
    with tarfile.open(archive, "w") as tar:
        for m, data in members:
            tar.addfile(m, io.BytesIO(data))


@pytest.mark.parametrize("compression", ["gzip", "zstd"])
def test_a_compressed_image_archive_is_streamed_in_layer_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    compression: str,
) -> None:  # fmt: skip
    """Three layers whose blobs lie last-first in the tar: the
    second deletes a file of the first and the third adds it back broken. Same findings as
    the uncompressed archive, and no temporary file."""
    layers = [
        [file("bin/a", b"#!/bin/missing-a\n"), file("bin/b", b"#!/bin/missing-b\n")],
        [file("bin/.wh.a", b"", 0o644)],
        [file("bin/a", b"#!/bin/missing-again\n")]
        + [file(f"x/{i}", b"#!/bin/b\n") for i in range(3)],
    ]
    image = Image(layers, compression="none")
    archive = docker25_archive(tmp_path / "w", image, tmp_path / "i.tar")
    reverse_layers(archive)
    expected = scan_json(capsys, str(archive))[1]["findings"]
    assert {(f["path"], f["message"].split()[2]) for f in expected} == {
        ("/bin/a", "/bin/missing-again"), ("/bin/b", "/bin/missing-b"),
    }  # fmt: skip
    packed = tmp_path / "i.tar.packed"
    raw = archive.read_bytes()
    packed.write_bytes(gzip.compress(raw) if compression == "gzip" else zstandard.compress(raw))

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a temporary file was opened")

    monkeypatch.setattr(tempfile, "TemporaryFile", refuse)
    code, doc = scan_json(capsys, str(packed))
    assert code == 1
    strip = [{k: v for k, v in f.items() if k != "image"} for f in doc["findings"]]
    assert strip == [{k: v for k, v in f.items() if k != "image"} for f in expected]


def test_a_docker_save_manifest_with_more_layers_than_allowed_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 24: manifest.json's Layers was not capped (an OCI manifest's is): 1,025 times
    the same 10 KiB layer was applied 1,025 times. Limits.max_layers holds for both now."""
    archive = legacy_docker_archive(image(), tmp_path / "legacy.tar")
    with tarfile.open(archive) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
        members = {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}  # type: ignore[union-attr]
    assert scan_json(capsys, str(archive))[0] == 1
    manifest[0]["Layers"] = manifest[0]["Layers"][:1] * 1025
    members["manifest.json"] = json.dumps(manifest).encode()
    with tarfile.open(archive, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    assert "an image of more than 1024 layers" in scan_error(capsys, str(archive))
