"""The kernel's per-cgroup counts forget removed cgroups (issue 9, item 6).

Real short-lived cgroups in this kernel's cgroup2 hierarchy, each running one failing
exec; a map of 192 entries (the agent's is 16,384) so that churn fills it fast.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from execwatch.attribution import Attributor
from execwatch.attribution.cri.client import CriContainers
from execwatch.attribution.mounts import cgroup_mounts
from execwatch.probe import Probe
from execwatch.probe.loader import ProbeOptions

ENTRIES = 192


@pytest.fixture
def scratch_cgroup() -> Iterator[Path]:
    unified = cgroup_mounts().unified
    assert unified is not None, "no cgroup2 hierarchy mounted"
    parent = Path(unified.mountpoint) / f"execwatch-counts-{os.getpid()}"
    parent.mkdir()
    try:
        yield parent
    finally:
        for child in parent.iterdir():
            if child.is_dir():
                child.rmdir()
        parent.rmdir()


def short_lived(parent: Path, n: int, binary: Path, tag: str) -> list[int]:
    """n cgroups that each see one failed exec and are removed at once; their ids."""
    ids = []
    for i in range(n):
        cg = parent / f"{tag}-{i}"
        cg.mkdir()
        ids.append(cg.stat().st_ino)  # a cgroup2 id is its directory's inode
        pid = os.fork()
        if pid == 0:
            (cg / "cgroup.procs").write_text(str(os.getpid()))
            try:
                os.execv(binary, [str(binary)])
            except OSError as exc:
                os._exit(exc.errno or 1)
            os._exit(0)
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == errno.ENOEXEC
        cg.rmdir()
    return ids


def settle(attributor: Attributor, ids: list[int]) -> None:
    """The inventory learns removals through inotify: wait until it has seen them."""
    deadline = time.monotonic() + 10
    while any(attributor.cgroup_alive(i) for i in ids):
        assert time.monotonic() < deadline, "the inventory never saw the removals"
        time.sleep(0.05)


def test_counts_of_removed_cgroups_are_pruned_and_the_map_never_fills(
    scratch_cgroup: Path, foreign_root: Path
) -> None:
    binary = foreign_root / "arm64/root/usr/bin/hello"
    with (
        Attributor(containers=CriContainers(sockets=[])) as attributor,
        Probe(ProbeOptions(count_entries=ENTRIES)) as probe,
    ):
        # Without pruning, churn fills the map: counter_map_full counts real losses.
        before = probe.stats()["counter_map_full"]
        first = short_lived(scratch_cgroup, ENTRIES + 64, binary, "a")
        assert probe.stats()["counter_map_full"] > before
        settle(attributor, first)
        assert probe.forget_counts(attributor.cgroup_alive) >= ENTRIES // 2
        assert not {cg for cg, _ in probe.counts_by_cgroup()} & set(first)

        # With pruning between rounds, 3x more cgroups than the map holds: nothing lost,
        # and each one's failure counted exactly once per cgroup.
        full = probe.stats()["counter_map_full"]
        for tag in ("b", "c", "d"):
            ids = short_lived(scratch_cgroup, ENTRIES * 5 // 8, binary, tag)
            counted = probe.counts_by_cgroup()
            assert [counted.get((cg, errno.ENOEXEC)) for cg in ids] == [1] * len(ids)
            settle(attributor, ids)
            probe.forget_counts(attributor.cgroup_alive)
        assert probe.stats()["counter_map_full"] == full
