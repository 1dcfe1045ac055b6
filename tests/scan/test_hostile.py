"""Bad and hostile input: one clear line on stderr, exit 2, nothing written anywhere."""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import os
import tarfile
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest
import zstandard

from execwatch.binfmt import Platform
from execwatch.runnable.fs import Node
from execwatch.runnable.limits import Limits
from execwatch.runnable.memory import MemoryFS
from execwatch.scan.errors import LimitExceeded
from execwatch.scan.layers import apply_layer
from execwatch.scan.runner import ScanOptions, scan
from tests.support.images.imagebuild import (
    Blobs,
    Entry,
    Image,
    file,
    legacy_docker_archive,
    oci_layout,
    symlink,
)
from tests.support.scan.scan_cli import run, scan_error


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


def deep(depth: int, leaf: str = "run") -> str:
    return "/".join(["d"] * depth) + "/" + leaf


def test_a_member_1200_directories_deep_is_scanned_and_whited_out_without_recursion(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 24: a 199-byte layer with one member 1,200 directories deep was a 2,009-line
    RecursionError. The tree is walked in loops: built, made opaque, whited out, checked."""
    script = file(deep(1200), b"#!/nowhere/sh\n")
    image = Image([[script]], entrypoint=["/" + deep(1200)])
    capsys.readouterr()
    assert run([str(oci_layout(tmp_path / "one", [image])), "--format", "json"]) == 1
    (finding,) = json.loads(capsys.readouterr().out)["findings"]
    assert (finding["check"], finding["path"]) == ("missing-shebang-interpreter", "/" + deep(1200))
    layers = [
        [script, file("bin/keep", b"#!/nowhere/sh\n")],
        [file(deep(1199, ".wh..wh..opq"), b"", 0o644), file(deep(600, ".wh..wh..opq"), b"", 0o644)],
        [file(".wh.d", b"", 0o644)],  # the whole tree, removed in one whiteout
    ]
    capsys.readouterr()
    assert run([str(oci_layout(tmp_path / "three", [Image(layers)])), "--format", "json"]) == 1
    (finding,) = json.loads(capsys.readouterr().out)["findings"]
    assert finding["path"] == "/bin/keep"


def test_a_member_deeper_than_the_tree_allows_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    layout = layout_with_raw_layer(tmp_path / "l", raw_layer([member(deep(3000))]), TAR)
    assert "deeper than 2048" in scan_error(capsys, str(layout))


def test_a_chain_of_2000_symlinks_is_a_loop_not_a_recursion_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    links = [symlink(f"l{i}", f"l{i + 1}") for i in range(2000)]
    image = Image([[*links, file("l2000", b"#!/nowhere/sh\n")]], entrypoint=["/l0"])
    message = scan_error(capsys, str(oci_layout(tmp_path / "l", [image])))
    assert "symlink loop at /l" in message and "more than 40 links nested" in message


def edit_first_layer(layout: Path, **fields: object) -> Path:
    """Change the first layer descriptor of the layout's (first) manifest, which is then
    stored under its new digest, as a writer of a hostile layout would."""
    index = json.loads((layout / "index.json").read_text())
    manifest = json.loads(
        (layout / "blobs/sha256" / index["manifests"][0]["digest"][7:]).read_bytes()
    )
    manifest["layers"][0] |= fields
    data = json.dumps(manifest).encode()
    digest = hashlib.sha256(data).hexdigest()
    (layout / "blobs/sha256" / digest).write_bytes(data)
    index["manifests"][0] |= {"digest": f"sha256:{digest}", "size": len(data)}
    (layout / "index.json").write_text(json.dumps(index))
    return layout


def test_a_layer_longer_than_its_descriptor_declares_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 24: a layer declared as 100 bytes was read whole (2 GB and more); reading stops
    at the 101st byte now, whatever the blob holds."""
    layout = layout_with_raw_layer(tmp_path / "l", raw_layer([member("x", size=1 << 20)]), TAR)
    edit_first_layer(layout, size=100)
    assert "layer larger than the 100 bytes it declares" in scan_error(capsys, str(layout))


@pytest.mark.parametrize("size", [-1, "100", True, 1.5])
def test_a_layer_descriptor_with_an_invalid_size_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], size: object
) -> None:
    layout = layout_with_raw_layer(tmp_path / "l", raw_layer([member("x")]), TAR)
    edit_first_layer(layout, size=size)
    assert "descriptor has no valid size" in scan_error(capsys, str(layout))


@pytest.mark.parametrize(
    "digest",
    [
        "sha256:" + "../" * 30 + "dev/zero",
        "sha256:" + "A" * 64,  # upper case
        "sha256:" + "a" * 63,
        "md5:" + "a" * 32,  # an algorithm hashlib knows, but no OCI digest
        "sha512:" + "a" * 64,
    ],
)
def test_layer_digests_that_are_not_oci_digests_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], digest: str
) -> None:
    layout = oci_layout(tmp_path / "l", [Image([[file("x", b"#!/bin/sh\n")]])])
    edit_first_layer(layout, digest=digest)
    assert "invalid digest" in scan_error(capsys, str(layout))


def test_each_image_has_a_time_and_a_byte_budget(tmp_path: Path) -> None:
    layout = oci_layout(tmp_path / "l", [Image([[file("bin/x", b"#!/nowhere/sh\n" * 5000)]])])
    amd64 = (Platform.parse("linux/amd64"),)
    assert scan(str(layout), ScanOptions(platforms=amd64)).findings
    with pytest.raises(LimitExceeded, match="not scanned within 0 s"):
        scan(str(layout), ScanOptions(platforms=amd64, limits=Limits(max_image_seconds=0)))
    small = ScanOptions(platforms=amd64, limits=Limits(max_image_bytes=100))
    with pytest.raises(LimitExceeded, match="more than 100 bytes read: its layers declare"):
        scan(str(layout), small)  # refused before reading: the descriptors say how much
    archive = legacy_docker_archive(Image([[file("bin/x", b"#!/nowhere/sh\n")]]), tmp_path / "a")
    with pytest.raises(LimitExceeded, match=r"more than 100 bytes read$"):
        scan(str(archive), small)  # no sizes declared: stopped while reading


def tree_cost(paths: list[str]) -> tuple[int, float, int]:
    """(MemoryFS loop steps, seconds, peak traced bytes) of putting `paths` (files, their
    parents implied), then applying a layer that makes the root opaque and whites out /d."""
    wipe = raw_layer([member(".wh..wh..opq", size=0), member(".wh.d", size=0)])
    tracemalloc.start()
    started = time.perf_counter()
    fs = MemoryFS()
    for path in paths:
        fs.put(path, Node("file"))
    apply_layer(fs, io.BytesIO(wipe), "wipe", Limits(), [0])
    seconds = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert list(fs.nodes) == ["/"] and fs.path_bytes == 0
    return fs.steps, seconds, peak


def best_of(runs: int, paths: list[str]) -> tuple[int, float, int]:
    costs = [tree_cost(paths) for _ in range(runs)]
    return costs[0][0], min(c[1] for c in costs), min(c[2] for c in costs)


def test_tree_work_grows_linearly_with_entries_and_with_depth() -> None:
    """x2 steps: entries 1k..16k (files in directories of 64), depth 128..2048 (one file,
    its parents implied). Loop steps are linear to the entry; time and traced memory
    within 40x over a 16x range, where a quadratic walk would be 256x."""
    by_entries = [
        best_of(3, [f"/d/{i // 64}/{i}" for i in range(n)]) for n in (1024 << k for k in range(5))
    ]
    by_depth = [tree_cost(["/" + deep(n - 1)]) for n in (128 << k for k in range(5))]
    for costs in (by_entries, by_depth):
        steps = [c[0] for c in costs]
        assert all(1.9 < b / a < 2.1 for a, b in itertools.pairwise(steps)), steps
    # Time on a loaded 2-core machine: the best of three runs per size. A deep member's
    # parents' paths grow with the square of its depth (bounded below), so its time is
    # judged by its steps alone.
    assert by_entries[-1][1] < 40 * by_entries[0][1], [c[1] for c in by_entries]
    assert by_entries[-1][2] < 40 * by_entries[0][2], [c[2] for c in by_entries]
    # one deep member implies all its parents: their paths (2048 + ... + 2 bytes) are what
    # it costs, bounded by Limits.max_tree_path_bytes and max_tree_depth
    assert by_depth[-1][2] < 16 << 20, by_depth[-1][2]
    with pytest.raises(LimitExceeded, match="deeper than 2048"):
        tree_cost(["/" + deep(2048)])
    with pytest.raises(LimitExceeded, match="more than 1000 entries"):
        MemoryFS(Limits(max_tree_nodes=1000)).put("/" + deep(1000), Node("file"))
    with pytest.raises(LimitExceeded, match="more than 4096 bytes of paths"):
        MemoryFS(Limits(max_tree_path_bytes=4096)).put("/" + deep(100), Node("file"))
