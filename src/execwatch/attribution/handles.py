"""Resolve a live cgroup id to its path at once, through open_by_handle_at(2).

On cgroup v2 the id the kernel reports is also the cgroup directory's file handle
(kernfs, handle type FILEID_KERNFS, 8 bytes). This is how bpftool and systemd turn an
id back into a path; it needs CAP_DAC_READ_SEARCH and fails with ESTALE once the
cgroup has been removed, which is why the inventory keeps recently deleted ones.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import struct

from execwatch.attribution.mounts import HierarchyMount

log = logging.getLogger(__name__)

FILEID_KERNFS = 0xFE


class _FileHandle(ctypes.Structure):
    _fields_ = (
        ("handle_bytes", ctypes.c_uint),
        ("handle_type", ctypes.c_int),
        ("f_handle", ctypes.c_ubyte * 8),
    )


class HandleResolver:
    """Keeps one fd on the cgroup2 mount; ``path_of`` costs two system calls."""

    def __init__(self, mount: HierarchyMount) -> None:
        self._mount = mount
        self._libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        self._mount_fd = os.open(mount.mountpoint, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    def path_of(self, cgroup_id: int) -> str | None:
        """Hierarchy path of a cgroup that still exists, else None."""
        if not 0 < cgroup_id < 1 << 64 or self._mount_fd < 0:
            return None
        handle = _FileHandle(8, FILEID_KERNFS)
        ctypes.memmove(handle.f_handle, struct.pack("=Q", cgroup_id), 8)
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
        fd = int(self._libc.open_by_handle_at(self._mount_fd, ctypes.byref(handle), flags))
        if fd < 0:
            return None
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
            if os.fstat(fd).st_ino != cgroup_id:
                return None
        except OSError:
            return None
        finally:
            os.close(fd)
        return self._mount.to_hierarchy_path(target)

    def close(self) -> None:
        if self._mount_fd >= 0:
            os.close(self._mount_fd)
            self._mount_fd = -1
