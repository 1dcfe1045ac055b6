"""Where a dead container's rootfs is looked for, and how little a hostile mount table costs.

A /proc-shaped tree stands in for procfs here (pure logic); tests/probe/
test_container_diagnosis.py proves the same lookup against a real containerd whose mounts
the tracer cannot see.
"""

from __future__ import annotations

import json
import os
import random
import signal
import tracemalloc
from pathlib import Path

from execwatch.diagnosis.container_rootfs import MAX_CANDIDATES, ContainerRootfs

CID = "4f" * 32


def task(proc: Path, pid: str, mounts: str | bytes = "", reachable: bool = True) -> Path:
    base = proc / pid
    (base / "ns").mkdir(parents=True)
    (base / "ns" / "mnt").touch()  # its own inode: its own mount namespace
    if reachable:
        (base / "root").mkdir()
    data = mounts.encode() if isinstance(mounts, str) else mounts
    (base / "mountinfo").write_bytes(data)
    return base


def line(mountpoint: str) -> str:
    return f"900 30 0:99 / {mountpoint} rw,relatime - overlay overlay rw\n"


def test_an_unreachable_init_leaves_the_parents_mount_table(tmp_path: Path) -> None:
    rootfs = f"/run/ctd/state/k8s.io/{CID}/rootfs"
    task(tmp_path, "1", line(rootfs), reachable=False)
    task(tmp_path, "4242", line("/var/lib/other") + line(rootfs))
    task(tmp_path, "self", line("/"))

    found = list(ContainerRootfs(tmp_path).candidates(CID, parent=4242))

    assert found == [tmp_path / "4242" / "root" / rootfs.lstrip("/")]


def test_init_first_then_the_parent_then_ourselves(tmp_path: Path) -> None:
    for pid in ("1", "77", "self"):
        task(tmp_path, pid, line(f"/{pid}/{CID}/rootfs"))

    found = list(ContainerRootfs(tmp_path).candidates(CID, parent=77))

    assert found == [tmp_path / pid / "root" / pid / CID / "rootfs" for pid in ("1", "77", "self")]


def test_no_parent_and_no_valid_id_look_nowhere_else(tmp_path: Path) -> None:
    task(tmp_path, "self", line(f"/x/{CID}/rootfs"))
    rootfs = ContainerRootfs(tmp_path)

    assert len(list(rootfs.candidates(CID, parent=0))) == 1
    assert list(rootfs.candidates("../../etc", parent=0)) == []
    assert list(rootfs.candidates(None)) == []


def test_a_tenant_filled_mount_table_is_read_within_bounds(tmp_path: Path) -> None:
    """200,000 mounts naming the container (30 MiB), and one 1 MiB line with no newline."""
    flood = line(f"/t/{CID}/m") * 200_000
    task(tmp_path, "666", b"x" * (1 << 20) + flood.encode())

    tracemalloc.start()
    try:
        found = list(ContainerRootfs(tmp_path).candidates(CID, parent=666))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert len(found) == MAX_CANDIDATES
    assert peak < 1 << 20, f"peak {peak} bytes"


def test_a_hostile_crio_config_is_ignored(tmp_path: Path) -> None:
    view = task(tmp_path, "self")
    config = view / "root/run/containers/storage/overlay-containers" / CID / "userdata"
    config.mkdir(parents=True)
    (config / "config.json").write_text("[" * 500_000)

    assert list(ContainerRootfs(tmp_path).candidates(CID)) == []


def test_random_mount_tables_and_configs_never_raise_nor_grow(tmp_path: Path) -> None:
    """Fuzzing with a fixed seed: fragments of real lines, the id, spaces, escapes, NULs and
    random bytes, as a parent's mount table and as a CRI-O config."""
    rng = random.Random(1)
    pieces = [line(f"/k8s.io/{CID}/rootfs").encode(), CID.encode(), b" ", b"\n", b"\\040", b"\0"]
    view = task(tmp_path, "99")
    config = view / "root/run/containers/storage/overlay-containers" / CID / "userdata"
    config.mkdir(parents=True)
    rootfs = ContainerRootfs(tmp_path)
    peak = 0
    for _ in range(300):
        blob = b"".join(
            rng.choice(pieces) if rng.random() < 0.7 else rng.randbytes(rng.randrange(1, 300))
            for _ in range(rng.randrange(1, 400))
        )
        (view / "mountinfo").write_bytes(blob)
        (config / "config.json").write_bytes(blob[: rng.randrange(len(blob) + 1)])
        tracemalloc.start()
        try:
            found = list(rootfs.candidates(CID, parent=99))
            peak = max(peak, tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
        assert len(found) <= MAX_CANDIDATES + 1  # the mounts, and at most one CRI-O root
        assert all(p.is_relative_to(view / "root") for p in found)
    assert peak < 1 << 20, f"peak {peak} bytes"


def test_a_parents_crio_config_is_read_inside_its_root_and_never_blocks(tmp_path: Path) -> None:
    """A tenant parent's view: its config.json as a symlink to a file of the node names no
    rootfs, and as a FIFO without a writer it is not waited on (SIGALRM fails a hang)."""
    view = task(tmp_path, "99")
    config = view / "root/run/containers/storage/overlay-containers" / CID / "userdata"
    config.mkdir(parents=True)
    node_file = tmp_path / "node-config.json"
    node_file.write_text(json.dumps({"root": {"path": "/var/lib/node-secret"}}))
    (config / "config.json").symlink_to(node_file)
    rootfs = ContainerRootfs(tmp_path)
    assert list(rootfs.candidates(CID, parent=99)) == []

    (config / "config.json").unlink()
    os.mkfifo(config / "config.json")
    signal.alarm(5)
    try:
        assert list(rootfs.candidates(CID, parent=99)) == []
    finally:
        signal.alarm(0)

    (config / "config.json").unlink()
    (config / "config.json").write_text(json.dumps({"root": {"path": "/ctr/rootfs"}}))
    assert list(rootfs.candidates(CID, parent=99)) == [view / "root" / "ctr/rootfs"]
