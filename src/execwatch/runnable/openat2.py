"""Opening files inside another task's root without ever leaving it: the one openat2 wrapper.

openat2(RESOLVE_IN_ROOT) makes the kernel treat the directory fd as "/" for the whole
lookup: absolute symlinks and ".." stay inside the container's root filesystem, so a
hostile image cannot point execwatch at a file of the node. O_NONBLOCK keeps FIFOs
from blocking and only regular files are read.
"""

from __future__ import annotations

import ctypes
import os
import stat
from dataclasses import dataclass
from typing import Protocol

SYS_OPENAT2 = 437  # the same number on every architecture (added with the unified table)
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_IN_ROOT = 0x10
READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class NotRegularFile(OSError):
    pass


class MountGuard(Protocol):
    """Refuses (raises) a mount where an earlier read overran its budget
    (diagnosis.budget.SlowMounts)."""

    def enter(self, fd: int) -> None: ...


class OpenHow(ctypes.Structure):
    _fields_ = (("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64))


@dataclass(frozen=True)
class Root:
    """An O_PATH fd on a task's root directory. The fd pins the filesystem while open."""

    fd: int
    description: str  # where it came from, for the diagnosis detail

    def close(self) -> None:
        os.close(self.fd)


class Resolver:
    """openat2 through libc's syscall(); one instance per process is enough."""

    def __init__(self, slow: MountGuard | None = None) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._libc.syscall.restype = ctypes.c_long
        self._slow = slow

    def lookup(self, root: Root, path: str, *, follow: bool = True) -> int:
        """An O_PATH fd for path inside root (nothing is opened for reading); raise OSError.
        follow=False: a final symlink is the fd's file, not followed."""
        flags = os.O_PATH | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
        how = OpenHow(flags=flags, mode=0, resolve=RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)
        fd = self._libc.syscall(
            SYS_OPENAT2, root.fd, os.fsencode(path), ctypes.byref(how), ctypes.sizeof(how)
        )
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), path)
        return int(fd)

    def open_regular(self, root: Root, path: str) -> int:
        """Open path for reading only if it is a regular file: devices are never opened."""
        return reopen_regular(self.lookup(root, path), path, self._slow)

    def exists(self, root: Root, path: str) -> bool:
        try:
            os.close(self.lookup(root, path))
        except FileNotFoundError:
            return False
        except OSError:
            return True  # present but unresolvable (ELOOP, EACCES…): not "missing"
        return True


def reopen_regular(path_fd: int, name: str, slow: MountGuard | None = None) -> int:
    """Turn an O_PATH fd into a read fd after checking it is a regular file; closes path_fd.

    `slow` refuses a mount where an earlier diagnosis overran its budget."""
    try:
        if slow is not None:
            slow.enter(path_fd)
        mode = os.fstat(path_fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile(0, f"not a regular file ({stat.filemode(mode)[0]})", name)
        return os.open(f"/proc/self/fd/{path_fd}", READ_FLAGS)
    finally:
        os.close(path_fd)
