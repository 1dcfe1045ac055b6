"""inotify(7) through ctypes: the standard library has no binding and a dependency is not
worth four system calls."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass

IN_MODIFY = 0x00000002
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_ISDIR = 0x40000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC

_HEADER = struct.Struct("iIII")


@dataclass(frozen=True, slots=True)
class InotifyEvent:
    wd: int
    mask: int
    cookie: int
    name: str


class Inotify:
    """A non-blocking inotify instance. ``fd`` is for select/poll; ``read`` drains it."""

    def __init__(self) -> None:
        self._libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        fd = self._libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self.fd: int = fd

    def add_watch(self, path: str, mask: int) -> int:
        wd = int(self._libc.inotify_add_watch(self.fd, os.fsencode(path), mask))
        if wd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), path)
        return wd

    def rm_watch(self, wd: int) -> None:
        self._libc.inotify_rm_watch(self.fd, wd)

    def read(self, bufsize: int = 1 << 16) -> Iterator[InotifyEvent]:
        try:
            data = os.read(self.fd, bufsize)
        except BlockingIOError:
            return
        offset = 0
        while offset + _HEADER.size <= len(data):
            wd, mask, cookie, length = _HEADER.unpack_from(data, offset)
            offset += _HEADER.size
            raw = data[offset : offset + length]
            offset += length
            yield InotifyEvent(wd, mask, cookie, os.fsdecode(raw.rstrip(b"\x00")))

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
