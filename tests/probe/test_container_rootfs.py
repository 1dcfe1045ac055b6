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

from execwatch.diagnosis.container_rootfs import MAX_CANDIDATES, Candidate, ContainerRootfs
from execwatch.diagnosis.roots import RootLocator
from execwatch.record import ExecFailed

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

    found = [c.path for c in ContainerRootfs(tmp_path).candidates(CID, parent=4242)]

    assert found == [tmp_path / "4242" / "root" / rootfs.lstrip("/")]


def test_init_first_then_the_parent_then_ourselves(tmp_path: Path) -> None:
    for pid in ("1", "77", "self"):
        task(tmp_path, pid, line(f"/{pid}/{CID}/rootfs"))

    found = [c.path for c in ContainerRootfs(tmp_path).candidates(CID, parent=77)]

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
        found = [c.path for c in ContainerRootfs(tmp_path).candidates(CID, parent=666)]
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
            found = [c.path for c in rootfs.candidates(CID, parent=99)]
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
    assert [c.path for c in rootfs.candidates(CID, parent=99)] == [view / "root" / "ctr/rootfs"]


def test_a_symlink_in_a_views_root_never_leads_to_the_nodes_files(tmp_path: Path) -> None:
    """A mount path is opened inside the view's root (RESOLVE_IN_ROOT): a symlink a tenant
    put on the way to "/etc" resolves to the view's /etc, never the node's, even when the
    node's is the very inode the locator is looking for."""
    view_root = tmp_path / "7" / "root"
    view_root.mkdir(parents=True)
    (view_root / "ctr").symlink_to("/etc")
    host = os.stat("/etc")
    event = ExecFailed(
        time=0.0, errno=8, pid=1 << 22, tgid=1 << 22, ppid=0, uid=0, comm="t",
        parent_comm="p", path="/x", cgroup_id=0, mntns=0, syscall="execve",
        root_ino=host.st_ino, root_dev=host.st_dev,
    )  # fmt: skip
    locator = RootLocator(tmp_path, extra=[lambda _: [Candidate(view_root, "/ctr")]])
    assert locator.open(event) is None
    (view_root / "etc").mkdir()  # the view's own /etc: found, and refused (another inode)
    assert locator.open(event) is None
