"""The cgroup inventory: ids resolve to paths while the cgroup lives and after it is gone."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from execwatch.attribution.cgroup_inventory import CgroupInventory
from execwatch.attribution.mounts import HierarchyMount, cgroup_mounts, parse_mountinfo


def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


@pytest.fixture
def unified() -> HierarchyMount:
    mount = cgroup_mounts().unified
    assert mount is not None, "this host has no cgroup2 hierarchy mounted"
    return mount


@pytest.fixture
def scratch_cgroup(unified: HierarchyMount) -> Iterator[str]:
    """A private subtree of the real cgroup2 hierarchy, removed afterwards."""
    path = f"/execwatch-test-{uuid.uuid4().hex[:12]}"
    fs_path = unified.to_fs_path(path)
    assert fs_path is not None
    fs_path.mkdir()
    yield path
    for dirpath, _dirs, _files in sorted(os.walk(fs_path), key=lambda t: -len(t[0])):
        os.rmdir(dirpath)


def test_mountinfo_finds_the_unified_hierarchy_on_hybrid_and_pure_v2_hosts() -> None:
    hybrid = (
        "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
        "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
        "40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd\n"
        "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
    )
    mounts = parse_mountinfo(hybrid)
    assert mounts.unified == HierarchyMount(Path("/sys/fs/cgroup/unified"), "/")
    assert mounts.v1["memory"].mountpoint == Path("/sys/fs/cgroup/memory")
    assert mounts.v1["name=systemd"].mountpoint == Path("/sys/fs/cgroup/systemd")
    pure = (
        "30 24 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
        "99 30 0:26 /kubepods /mnt/my\\040pods rw - cgroup2 cgroup2 rw\n"
    )
    mounts = parse_mountinfo(pure)
    assert mounts.unified == HierarchyMount(Path("/sys/fs/cgroup"), "/")
    assert mounts.v1 == {}
    sub = HierarchyMount(Path("/mnt/my pods"), "/kubepods")
    assert sub.to_hierarchy_path("/mnt/my pods/besteffort") == "/kubepods/besteffort"
    assert sub.to_fs_path("/kubepods/besteffort") == Path("/mnt/my pods/besteffort")
    assert sub.to_fs_path("/system.slice") is None
    assert parse_mountinfo("garbage\n\n1 2 3\n") == parse_mountinfo("")


def test_a_cgroup_created_after_start_resolves_by_its_inode_and_after_removal(
    unified: HierarchyMount, scratch_cgroup: str
) -> None:
    inventory = CgroupInventory(unified, use_handles=False)
    inventory.start()
    try:
        base = unified.to_fs_path(scratch_cgroup)
        assert base is not None
        leaf = base / "pod-a" / "ctr-1"
        leaf.mkdir(parents=True)
        cgroup_id = leaf.stat().st_ino
        assert wait_for(lambda: inventory.lookup(cgroup_id) is not None)
        entry = inventory.lookup(cgroup_id)
        assert entry is not None
        assert (entry.path, entry.alive) == (f"{scratch_cgroup}/pod-a/ctr-1", True)
        leaf.rmdir()

        def retired() -> bool:
            e = inventory.lookup(cgroup_id)
            return e is not None and not e.alive

        assert wait_for(retired)
        gone = inventory.lookup(cgroup_id)
        assert gone is not None and gone.path == f"{scratch_cgroup}/pod-a/ctr-1"
    finally:
        inventory.close()


def test_nested_directories_created_in_one_go_are_all_learned(
    unified: HierarchyMount, scratch_cgroup: str
) -> None:
    inventory = CgroupInventory(unified, use_handles=False)
    inventory.start()
    try:
        base = unified.to_fs_path(scratch_cgroup)
        assert base is not None
        deep = base / "a" / "b" / "c" / "d"
        deep.mkdir(parents=True)  # faster than the watcher can add watches level by level
        ids = {p.stat().st_ino: p for p in (base / "a", base / "a/b", base / "a/b/c", deep)}
        assert wait_for(lambda: all(inventory.lookup(i) is not None for i in ids))
    finally:
        inventory.close()


def test_live_cgroups_unknown_to_the_inventory_resolve_through_their_file_handle(
    unified: HierarchyMount, scratch_cgroup: str
) -> None:
    inventory = CgroupInventory(unified, use_handles=True, watch=False, rescan_interval=3600)
    inventory.start()
    try:
        base = unified.to_fs_path(scratch_cgroup)
        assert base is not None
        leaf = base / "late"
        leaf.mkdir()  # not watched, not rescanned: only open_by_handle_at can find it
        entry = inventory.lookup(leaf.stat().st_ino)
        assert entry is not None and entry.path == f"{scratch_cgroup}/late" and entry.alive
        assert inventory.lookup(2**63 + 12345) is None
    finally:
        inventory.close()


def test_rescan_learns_what_was_missed_and_retires_what_vanished(
    unified: HierarchyMount, scratch_cgroup: str
) -> None:
    base = unified.to_fs_path(scratch_cgroup)
    assert base is not None
    (base / "old").mkdir()
    inventory = CgroupInventory(unified, use_handles=False, watch=False, rescan_interval=3600)
    inventory.start()
    try:
        old_id = (base / "old").stat().st_ino
        assert inventory.lookup(old_id) is not None
        (base / "old").rmdir()
        (base / "new").mkdir()
        new_id = (base / "new").stat().st_ino
        assert inventory.lookup(new_id) is None
        inventory.rescan()
        assert inventory.lookup(new_id) is not None
        old = inventory.lookup(old_id)
        assert old is not None and not old.alive and old.path == f"{scratch_cgroup}/old"
    finally:
        inventory.close()


def test_memory_stays_bounded_while_thousands_of_cgroups_churn(
    unified: HierarchyMount, scratch_cgroup: str
) -> None:
    # cgroup ids are never reused (unlike tmpfs inode numbers), so old entries stay correct
    # until evicted.
    capacity = 300
    base = unified.to_fs_path(scratch_cgroup)
    assert base is not None
    inventory = CgroupInventory(unified, use_handles=False, recent_capacity=capacity)
    inventory.start()
    try:
        live_before = inventory.stats().live
        ids = []
        for i in range(2000):
            d = base / f"c{i}"
            d.mkdir()
            ids.append(d.stat().st_ino)
            if i % 50 == 49:
                assert wait_for(lambda: inventory.lookup(ids[-1]) is not None)
                for j in range(i - 49, i + 1):
                    (base / f"c{j}").rmdir()
        assert wait_for(lambda: inventory.stats().live == live_before)
        stats = inventory.stats()
        assert stats.recently_deleted == capacity
        assert stats.watches == live_before
        recent = inventory.lookup(ids[-1])
        assert recent is not None and recent.path == f"{scratch_cgroup}/c1999"
        assert not recent.alive
        assert inventory.lookup(ids[0]) is None  # evicted: unknown, never a wrong answer
    finally:
        inventory.close()


def test_lookups_are_safe_and_cheap_from_many_threads(
    unified: HierarchyMount, scratch_cgroup: str
) -> None:
    base = unified.to_fs_path(scratch_cgroup)
    assert base is not None
    for i in range(200):
        (base / f"c{i}").mkdir()
    inventory = CgroupInventory(unified, use_handles=False)
    inventory.start()
    try:
        ids = [(base / f"c{i}").stat().st_ino for i in range(200)]
        errors: list[BaseException] = []

        def reader() -> None:
            try:
                for _ in range(50):
                    for cid in ids:
                        assert inventory.lookup(cid) is not None
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=reader) for _ in range(4)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        per_lookup = (time.perf_counter() - start) / (4 * 50 * 200)
        assert errors == []
        assert per_lookup < 1e-3  # a dict access under a lock; generous for a loaded machine
    finally:
        inventory.close()
