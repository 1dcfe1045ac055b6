"""The few system calls Python's os module lacks: mount, umount2, pivot_root, prctl."""

from __future__ import annotations

import ctypes
import fcntl
import os
import platform
import socket
import struct

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
MNT_DETACH = 0x2
CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_NO_NEW_PRIVS = 38
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1


class Kernel:
    """libc's mount family through ctypes; every failure is an OSError naming the call."""

    def __init__(self) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._libc.syscall.restype = ctypes.c_long

    def _check(self, rc: int, what: str) -> None:
        if rc < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{what}: {os.strerror(err)}")

    def mount(self, source: str, target: str, fstype: str, flags: int, data: str = "") -> None:
        rc = self._libc.mount(
            source.encode(), target.encode(), fstype.encode() if fstype else None,
            ctypes.c_ulong(flags), data.encode() if data else None,
        )  # fmt: skip
        self._check(rc, f"mount {fstype or 'bind'} on {target}")

    def umount(self, target: str, flags: int = 0) -> None:
        self._check(self._libc.umount2(target.encode(), flags), f"umount {target}")

    def pivot_root(self, new: str, old: str) -> None:
        number = SYS_PIVOT_ROOT.get(platform.machine())
        if number is None:
            raise OSError(0, f"pivot_root: unknown syscall number on {platform.machine()}")
        rc = self._libc.syscall(ctypes.c_long(number), new.encode(), old.encode())
        self._check(rc, "pivot_root")

    def unshare(self, flags: int) -> None:
        """os.unshare is Python 3.12's."""
        self._check(self._libc.unshare(ctypes.c_int(flags)), "unshare")

    def sethostname(self, name: str) -> None:
        data = name.encode()
        self._check(self._libc.sethostname(data, ctypes.c_size_t(len(data))), "sethostname")

    def prctl(self, option: int, arg: int) -> None:
        rc = self._libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0)
        self._check(rc, f"prctl {option}")


def loopback_up() -> None:
    """A new network namespace has `lo`, down: bring it up, and nothing else exists."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(s.fileno(), SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(s.fileno(), SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | IFF_UP))
