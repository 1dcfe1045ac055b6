"""Bad and hostile input: one clear line on stderr, exit 2, nothing written anywhere."""

from __future__ import annotations

import io
import json
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import zstandard

from tests.scan.helpers import run, scan_error
from tests.scan.imagebuild import Blobs, Entry, Image, file, oci_layout, symlink


def raw_layer(members: list[tarfile.TarInfo]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for m in members:
            tar.addfile(m, io.BytesIO(b"x" * m.size) if m.isreg() else None)
    return buf.getvalue()


def member(
    name: str, kind: bytes = tarfile.REGTYPE, link: str = "", size: int = 1
) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    info.size = size if kind == tarfile.REGTYPE else 0
    return info


def layout_with_raw_layer(root: Path, layer: bytes, media_type: str) -> Path:
    """An OCI layout whose single layer is given as raw bytes."""
    blobs = Blobs(root)
    layer_desc = blobs.put(layer, media_type)
    config = blobs.put_json(Image([]).config(), "application/vnd.oci.image.config.v1+json")
    manifest = blobs.put_json(
        {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
         "config": config, "layers": [layer_desc]},
        "application/vnd.oci.image.manifest.v1+json",
    )  # fmt: skip
    (root / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [manifest]}))
    (root / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    return root


def snapshot(root: Path) -> set[str]:
    return {str(p) for p in root.rglob("*")}


@pytest.fixture
def sandbox(tmp_path: Path) -> Iterator[Path]:
    """A working directory for the scan; tests assert nothing new appears around it."""
    d = tmp_path / "sandbox"
    d.mkdir()
    cwd = os.getcwd()
    os.chdir(d)
    yield d
    os.chdir(cwd)


TAR = "application/vnd.oci.image.layer.v1.tar"


@pytest.mark.parametrize(
    ("members", "expected"),
    [
        ([member("../../etc/evil")], "path climbs out of the image: '../../etc/evil'"),
        ([member("usr/../../evil")], "path climbs out of the image"),
        ([member("/etc/evil")], "absolute path in layer: '/etc/evil'"),
        ([member("x", tarfile.LNKTYPE, "../../etc/passwd")], "path climbs out of the image"),
        ([member("x", tarfile.LNKTYPE, "does/not/exist")], "hardlink /x -> does/not/exist"),
    ],
)
def test_hostile_tar_entries(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], sandbox: Path,
    members: list[tarfile.TarInfo], expected: str,
) -> None:  # fmt: skip
    layout = layout_with_raw_layer(tmp_path / "layout", raw_layer(members), TAR)
    before = snapshot(tmp_path)
    out = tmp_path / "report.json"
    message = scan_error(capsys, str(layout), "--format", "json", "--output", str(out))
    assert expected in message
    assert snapshot(tmp_path) == before  # no report, no extracted file, nothing
    assert not Path("/etc/evil").exists()


def test_symlink_loop_on_the_entrypoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    image = Image([[symlink("a", "b"), symlink("b", "a")]], entrypoint=["/a"])
    message = scan_error(capsys, str(oci_layout(tmp_path / "l", [image])))
    assert "symlink loop at /" in message


def test_symlink_loop_in_a_rootfs_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "root"
    (root / "bin").mkdir(parents=True)
    (root / "bin/x").write_bytes(b"#!/bin/loop\n")
    (root / "bin/x").chmod(0o755)
    os.symlink("loop2", root / "bin/loop")
    os.symlink("/bin/loop", root / "bin/loop2")
    assert "symlink loop" in scan_error(capsys, str(root))


def test_rootfs_symlinks_never_reach_the_host(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """/bin/sh -> /usr/bin/dash must be looked up in the rootfs, not on this machine."""
    root = tmp_path / "root"
    (root / "bin").mkdir(parents=True)
    os.symlink("/usr/bin/env", root / "bin/env")  # exists on the host, not in the root
    (root / "run").write_bytes(b"#!/bin/env sh\n")
    (root / "run").chmod(0o755)
    capsys.readouterr()
    assert run([str(root), "--format", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert [f["check"] for f in doc["findings"]] == ["missing-shebang-interpreter"]


def test_decompression_bomb_is_bounded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A 4 GiB file of zeros packs into a few hundred KiB of zstd; decompression stops early."""
    header = tarfile.TarInfo("zeros")
    header.size = 4 << 30
    compressor = zstandard.ZstdCompressor(level=3)
    packed = io.BytesIO()
    with compressor.stream_writer(packed, closefd=False) as w:
        w.write(header.tobuf(format=tarfile.USTAR_FORMAT))
        chunk = bytes(16 << 20)
        for _ in range(header.size // len(chunk)):
            w.write(chunk)
    assert packed.tell() < 1 << 20
    layout = layout_with_raw_layer(tmp_path / "l", packed.getvalue(), TAR + "+zstd")
    assert "decompression bomb" in scan_error(capsys, str(layout))


def test_huge_pax_header_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pax = tarfile.TarInfo("././@PaxHeader")
    pax.type = tarfile.XHDTYPE
    pax.size = 512 << 20
    data = pax.tobuf(format=tarfile.USTAR_FORMAT) + bytes(1024)
    layout = layout_with_raw_layer(tmp_path / "l", data, TAR)
    assert "tar extension header" in scan_error(capsys, str(layout))


@pytest.mark.parametrize(
    "media_type",
    ["application/vnd.oci.image.layer.v1.tar+encrypted", "application/octet-stream"],
)
def test_unknown_layer_media_type(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], media_type: str
) -> None:
    layout = layout_with_raw_layer(tmp_path / "l", raw_layer([member("x")]), media_type)
    assert f"unknown layer media type '{media_type}'" in scan_error(capsys, str(layout))


def test_tampered_layer_fails_its_digest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    layout = layout_with_raw_layer(tmp_path / "l", raw_layer([member("x")]), TAR)
    blob = next(p for p in (layout / "blobs/sha256").iterdir() if p.stat().st_size >= 10240)
    data = bytearray(blob.read_bytes())
    data[600] ^= 0xFF
    blob.write_bytes(bytes(data))
    assert "does not match its digest" in scan_error(capsys, str(layout))


def test_digest_that_is_a_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    layout = oci_layout(tmp_path / "l", [Image([[file("x", b"")]])])
    index = json.loads((layout / "index.json").read_text())
    index["manifests"][0]["digest"] = "sha256:../../../../etc/passwd"
    (layout / "index.json").write_text(json.dumps(index))
    assert "invalid digest" in scan_error(capsys, str(layout))


@pytest.mark.parametrize(
    "content",
    [b"", b"\x1f\x8b\x08\x00garbage", b"\x28\xb5\x2f\xfdgarbage", b"x" * 700],
)
def test_corrupt_layer(tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes) -> None:
    layout = layout_with_raw_layer(tmp_path / "l", content, TAR + "+gzip")
    message = scan_error(capsys, str(layout))
    assert "corrupt layer" in message or "unreadable layer" in message


def test_missing_target_and_garbage_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert "No such file or directory" in scan_error(capsys, str(tmp_path / "nope"))
    layout = oci_layout(tmp_path / "l", [Image([[file("x", b"")]])])
    (layout / "index.json").write_text("{not json")
    assert "index.json is not valid JSON" in scan_error(capsys, str(layout))


def test_hostile_elf_in_an_image_is_a_finding_not_a_crash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    entries: list[Entry] = [file("bin/bad", b"\x7fELF\x02\x01\x01" + bytes(9) + b"\xff" * 48)]
    layout = oci_layout(tmp_path / "l", [Image([entries])])
    capsys.readouterr()
    assert run([str(layout), "--format", "json"]) == 1
    (finding,) = json.loads(capsys.readouterr().out)["findings"]
    assert finding["check"] == "corrupt-binary"


def test_a_symlink_climbing_above_the_root_is_clamped_like_a_chroot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """/bin/run -> ../../../../opt/tool: `..` stops at the image root, so the link names
    /opt/tool inside the image. The image is scanned, not rejected, and nothing outside
    the image is looked at."""
    image = Image(
        [[file("opt/tool", b"#!/nowhere/sh\n"), symlink("bin/run", "../../../../opt/tool")]],
        entrypoint=["/bin/run"],
    )
    capsys.readouterr()
    assert run([str(oci_layout(tmp_path / "l", [image])), "--format", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    found = {(f["check"], f["path"], f.get("entrypoint", False)) for f in doc["findings"]}
    assert ("missing-shebang-interpreter", "/opt/tool", True) in found  # the resolved file
