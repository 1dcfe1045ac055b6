"""Real container engines for the tests: a private dockerd, and a running `execwatch trace`."""

from pathlib import Path

from execwatch.attribution.mounts import cgroup_mounts


def unified_cgroup(path: str) -> Path:
    """Where a cgroup2 path shows in this host's unified hierarchy (/sys/fs/cgroup on a
    pure v2 host, /sys/fs/cgroup/unified on a hybrid one)."""
    unified = cgroup_mounts().unified
    fs_path = unified.to_fs_path(path) if unified is not None else None
    if fs_path is None:
        raise RuntimeError("no cgroup2 hierarchy is mounted: the engine tests need one")
    return fs_path
