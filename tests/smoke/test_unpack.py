"""Unpacking an image for a run: the scan's tar rules, on disk, and nothing outside the root."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from execwatch.runnable.limits import Limits
from execwatch.scan.errors import LimitExceeded, ScanInputError
from execwatch.scan.isolated import ProcessLimits, run_isolated
from execwatch.scan.oci import images_in_store
from execwatch.scan.sources import directory_store
from execwatch.smoke.kernel import PR_SET_DUMPABLE, Kernel
from execwatch.smoke.unpack import TMPFS_BYTES, Unpacked, unpack_image, unpack_root
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


def in_a_child(root: Path, image_dir: Path, tmpfs_bytes: int, as_nobody: bool) -> dict[str, object]:
    """unpack_root of the image laid out in `image_dir` onto `root`, in a child process (its
    namespaces are its own): what it says, and what that child sees at `root`."""
    layout = image_dir / "layout"
    [image] = images_in_store(directory_store(str(layout)), Limits())

    def work() -> dict[str, object]:
        if as_nobody:
            os.setgroups([])
            os.setresgid(65534, 65534, 65534)
            os.setresuid(65534, 65534, 65534)
            Kernel().prctl(PR_SET_DUMPABLE, 1)  # as a process started as nobody is
        stats = unpack_root(image, str(root), Limits(), 1 << 30, tmpfs_bytes)
        return {"on_tmpfs": stats.on_tmpfs, "fstype": _fstype(root), "files": tree(root)}

    return run_isolated(work, ProcessLimits(wall_s=60), "unpack")


def _fstype(path: Path) -> str:
    """The type of the file system mounted on `path` as this process sees it, or ''."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == str(path):
            return fields[fields.index("-") + 1]
    return ""


@pytest.mark.parametrize("as_nobody", [False, True], ids=["root", "nobody"])
def test_a_small_image_unpacks_on_a_tmpfs_only_its_run_sees(
    shared_dir: Path, as_nobody: bool
) -> None:
    oci_layout(shared_dir / "layout", [Image([[file("bin/x", b"\x7fELF" * 64)]],
                                             entrypoint=["/bin/x"])])  # fmt: skip
    root = shared_dir / "root"
    root.mkdir()
    os.chown(root, 65534 if as_nobody else 0, 65534 if as_nobody else 0)
    seen = in_a_child(root, shared_dir, TMPFS_BYTES, as_nobody)
    assert seen == {"on_tmpfs": True, "fstype": "tmpfs", "files": {"bin", "bin/x"}}
    assert tree(root) == set()  # nothing of it here, nor left behind when its process ended


def test_an_image_past_the_tmpfs_bound_unpacks_on_disk(shared_dir: Path) -> None:
    """Incompressible, its declared layer is past the bound: the disk straight away.
    Compressible, it declares little and outgrows the tmpfs on the way: on disk again."""
    for name, data in (("noise", os.urandom(256 << 10)), ("zeros", bytes(256 << 10))):
        image_dir = shared_dir / name
        oci_layout(image_dir / "layout", [Image([[file(name, data, 0o644)]], entrypoint=["/x"])])
        root = image_dir / "root"
        root.mkdir()
        seen = in_a_child(root, image_dir, 64 << 10, as_nobody=False)
        assert seen == {"on_tmpfs": False, "fstype": "", "files": {name}}
        assert (root / name).read_bytes() == data
