"""Decoding ring-buffer records into KernelEvent."""

from __future__ import annotations

import os
import time

from execwatch.probe import layout
from execwatch.record import KernelEvent
from execwatch.text import c_string

AT_EMPTY_PATH = 0x1000


def boot_to_epoch_offset() -> float:
    """Seconds to add to CLOCK_BOOTTIME to get wall-clock time (the probe uses boot time)."""
    return time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)


def decode(raw: bytes, epoch_offset: float) -> KernelEvent:
    (
        ktime, cgroup_id, cgroup_parent_id, mntns, root_ino, err, pid, tgid, ppid, uid,
        dirfd, flags, syscall, comm, parent_comm, filename, fd_name, cgroup_name,
        root_dev, base_dev, base_ino, root_mnt_id, base_mnt_id, path_flags, _pad,
        root_path, base_path,
    ) = layout.EVENT_STRUCT.unpack_from(raw)  # fmt: skip
    path = c_string(filename)
    via_fd = not path and bool(flags & AT_EMPTY_PATH)
    if via_fd:
        path = c_string(fd_name)  # fexecve: only the basename behind the fd is known
    return KernelEvent(
        time=epoch_offset + ktime / 1e9,
        errno=err,
        pid=pid,
        tgid=tgid,
        ppid=ppid,
        uid=uid,
        comm=c_string(comm),
        parent_comm=c_string(parent_comm),
        path=path,
        cgroup_id=cgroup_id,
        mntns=mntns,
        root_ino=root_ino,
        cgroup_parent_id=cgroup_parent_id,
        cgroup_name=c_string(cgroup_name),
        syscall=layout.SYSCALLS[syscall] if syscall < len(layout.SYSCALLS) else str(syscall),
        dirfd=dirfd,
        flags=flags,
        via_fd=via_fd,
        root_dev=user_dev(root_dev),
        root_mnt_id=root_mnt_id,
        root_path=leaf_first(root_path) if path_flags & layout.ROOT_PATH_OK else None,
        base_dev=user_dev(base_dev),
        base_ino=base_ino,
        base_mnt_id=base_mnt_id,
        base_path=leaf_first(base_path) if path_flags & layout.BASE_IN_ROOT else None,
    )


def leaf_first(raw: bytes) -> str:
    """The BPF program's "c/b/a/" (names from the dentry chain, leaf first) as "/a/b/c"."""
    names = c_string(raw).split("/")
    return "/" + "/".join(reversed([n for n in names if n]))


def user_dev(kernel_dev: int) -> int:
    """A kernel dev_t (major << 20 | minor) as st_dev encodes it."""
    return os.makedev(kernel_dev >> 20, kernel_dev & 0xFFFFF)


def exe_path(raw_components: bytes, depth: int) -> str:
    """The executable's path from the kernel's leaf-first dentry names ("…/" when cut short).

    An empty slot is a mount crossing, not a component."""
    n = min(depth & 0xFF, layout.EXE_DEPTH)
    size = layout.EXE_NAME_LEN
    names = [c_string(raw_components[i * size : (i + 1) * size]) for i in range(n)]
    path = "/" + "/".join(name for name in reversed(names) if name)
    return "…" + path if depth & layout.EXE_TRUNCATED else path


def kernel_dev(dev: int) -> int:
    """The kernel's internal dev_t (major << 20 | minor) as st_dev reports it."""
    return os.makedev(dev >> 20, dev & 0xFFFFF)


def decode_death(raw: bytes, epoch_offset: float) -> KernelEvent:
    (
        ktime, age, cgroup_id, cgroup_parent_id, mntns, root_ino, exe_ino, exe_dev, _ip, _base,
        exit_code, sig, pid, tgid, ppid, uid, kind, depth, comm, parent_comm, exe, cgroup_name,
    ) = layout.DEATH_STRUCT.unpack_from(raw)  # fmt: skip
    signal_death = kind == layout.DEATH_SIGNAL
    return KernelEvent(
        time=epoch_offset + ktime / 1e9,
        errno=0,
        pid=pid,
        tgid=tgid,
        ppid=ppid,
        uid=uid,
        comm=c_string(comm),
        parent_comm=c_string(parent_comm),
        path=exe_path(exe, depth),
        cgroup_id=cgroup_id,
        mntns=mntns,
        syscall="signal" if signal_death else "exit_group",
        root_ino=root_ino,
        cgroup_parent_id=cgroup_parent_id,
        cgroup_name=c_string(cgroup_name),
        exit_code=None if signal_death else exit_code,
        signal=sig if signal_death else None,
        age_ms=age / 1e6,
        exe_ino=exe_ino,
        exe_dev=kernel_dev(exe_dev),
    )


def decode_record(raw: bytes, epoch_offset: float) -> KernelEvent:
    """Either ring buffer's record: the two structs differ in size (tests/probe/test_layout)."""
    if len(raw) == layout.DEATH_STRUCT.size:
        return decode_death(raw, epoch_offset)
    return decode(raw, epoch_offset)
