"""Unpacking an image for a run: the scan's tar rules, on disk, and nothing outside the root."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from execwatch.runnable.limits import Limits
from execwatch.scan.errors import LimitExceeded, ScanInputError
from execwatch.scan.oci import images_in_store
from execwatch.scan.sources import directory_store
from execwatch.smoke.unpack import Unpacked, unpack_image
from tests.support.images.imagebuild import (
    Entry,
    Image,
    directory,
    file,
    hardlink,
    oci_layout,
    symlink,
)


def unpack(tmp_path: Path, *layers: list[Entry], max_bytes: int = 1 << 30) -> tuple[Path, Unpacked]:
    layout = oci_layout(tmp_path / "layout", [Image(list(layers), entrypoint=["/x"])])
    [image] = images_in_store(directory_store(str(layout)), Limits())
    root = tmp_path / "root"
    root.mkdir()
    return root, unpack_image(image, str(root), Limits(), max_bytes)


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_whiteouts_and_opaque_directories(tmp_path: Path) -> None:
    lower = [file("a/x", b"1"), file("a/y", b"2"), file("b/z", b"3"), file("c/keep", b"4")]
    upper = [file("a/.wh..wh..opq", b""), file("a/new", b"5"), file("b/.wh.z", b"")]
    root, _ = unpack(tmp_path, lower, upper)
    assert tree(root) == {"a", "a/new", "b", "c", "c/keep"}


def test_no_device_node_fifo_or_setuid_bit(tmp_path: Path) -> None:
    layer = [Entry("dev/null", "chr"), Entry("run/fifo", "fifo"),
             file("bin/su", b"\x7fELF", 0o6755), directory("tmp")]  # fmt: skip
    root, stats = unpack(tmp_path, layer)
    assert not (root / "dev/null").exists() and not (root / "run/fifo").exists()
    assert stats.skipped_special == 2
    assert stat.S_IMODE((root / "bin/su").stat().st_mode) == 0o755
    assert stats.dropped_mode_bits == 1


def test_a_hardlink_is_the_same_file(tmp_path: Path) -> None:
    root, _ = unpack(tmp_path, [file("bin/a", b"same"), hardlink("bin/b", "bin/a")])
    assert os.path.samefile(root / "bin/a", root / "bin/b")


@pytest.mark.parametrize("target", ["{victim}", "../../../../../..{victim}"])
def test_a_planted_symlink_never_carries_a_write_outside(tmp_path: Path, target: str) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    planted = [symlink("etc", target.format(victim=victim))]
    with pytest.raises(ScanInputError, match="a symlink to nothing inside the image"):
        unpack(tmp_path, planted, [file("etc/passwd", b"root::0:0::/:/bin/sh\n")])
    assert list(victim.iterdir()) == []


def test_a_symlink_inside_the_root_is_followed_there(tmp_path: Path) -> None:
    layers = ([file("usr/etc/os-release", b"x"), symlink("etc", "/usr/etc")],
              [file("etc/passwd", b"root::0:0::/:/bin/sh\n")])  # fmt: skip
    root, _ = unpack(tmp_path, *layers)
    assert (root / "usr/etc/passwd").read_bytes().startswith(b"root:")


def test_what_is_written_is_capped(tmp_path: Path) -> None:
    with pytest.raises(LimitExceeded, match="unpacks to more than 1000 bytes"):
        unpack(tmp_path, [file("big", b"x" * 2000)], max_bytes=1000)
