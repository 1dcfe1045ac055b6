"""A task's root filesystem as the scanner's FileSystem view, read through openat2.

The linker (execwatch.scan.linker) resolves libraries over any FileSystem: the scanner
gives it an image's layers or an unpacked root, the node gives it this live view, so
both apply one set of loader rules. Every lookup stays inside the root
(RESOLVE_IN_ROOT, see confined.py), never follows a final symlink (the linker follows
them itself, inside the root), and reads only regular files. Bounded: the last MAX_NODES
entries described are kept (least recently used first out; an entry past the bound is
described again, never taken for missing), and MAX_DIR_ENTRIES names listed per directory.
How many lookups one diagnosis makes is the linker's budget (scan.limits.Limits).
"""

from __future__ import annotations

import ctypes
import os
import stat
from collections import OrderedDict
from collections.abc import Iterator

from execwatch.binfmt.errors import BinfmtError
from execwatch.binfmt.symbols import DynamicSymbols, read_dynamic_symbols
from execwatch.diagnosis.budget import SlowMounts
from execwatch.diagnosis.confined import (
    RESOLVE_IN_ROOT,
    RESOLVE_NO_MAGICLINKS,
    SYS_OPENAT2,
    OpenHow,
    Root,
    reopen_regular,
)
from execwatch.scan.fs import Node, describe_file

MAX_NODES = 4096
MAX_DIR_ENTRIES = 4096
READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class RootView:
    """execwatch.scan.fs.FileSystem over an O_PATH fd on a task's root."""

    def __init__(self, root: Root, slow: SlowMounts | None = None) -> None:
        self._root = root
        self._slow = slow
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._libc.syscall.restype = ctypes.c_long
        self._cache: OrderedDict[str, Node | None] = OrderedDict()

    def _lookup(self, path: str) -> int:
        """An O_PATH fd, after `slow` (see budget.py) has seen its mount: a hung file
        system is refused instead of blocking fstat and reads."""
        fd = self._openat2(path)
        if self._slow is not None:
            try:
                self._slow.enter(fd)
            except BaseException:
                os.close(fd)
                raise
        return fd

    def _openat2(self, path: str) -> int:
        how = OpenHow(
            flags=os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC,
            mode=0,
            resolve=RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS,
        )
        fd = self._libc.syscall(
            SYS_OPENAT2, self._root.fd, os.fsencode(path), ctypes.byref(how), ctypes.sizeof(how)
        )
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), path)
        return int(fd)

    def node(self, path: str) -> Node | None:
        if path in self._cache:
            self._cache.move_to_end(path)
            return self._cache[path]
        node = self._cache[path] = self._load(path)
        if len(self._cache) > MAX_NODES:
            self._cache.popitem(last=False)
        return node

    @property
    def cached(self) -> int:
        """How many entries are kept (at most MAX_NODES)."""
        return len(self._cache)

    def stat(self, path: str) -> os.stat_result | None:
        """lstat inside the root."""
        try:
            fd = self._lookup(path)
        except OSError:
            return None
        try:
            return os.fstat(fd)
        finally:
            os.close(fd)

    def _load(self, path: str) -> Node | None:
        try:
            fd = self._lookup(path)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            mode = stat.S_IMODE(st.st_mode)
            if stat.S_ISLNK(st.st_mode):
                return Node("symlink", target=os.readlink("", dir_fd=fd))
            if stat.S_ISDIR(st.st_mode):
                return Node("dir", mode)
            if not stat.S_ISREG(st.st_mode):
                return Node("other", mode)
            try:
                rfd = os.open(f"/proc/self/fd/{fd}", READ_FLAGS)
            except OSError:
                return Node("file", mode, st.st_size)
            with open(rfd, "rb", buffering=4096) as f:
                return describe_file(path, f, st.st_size, mode)
        except OSError:
            return None
        finally:
            os.close(fd)

    def dynamic_symbols(self, path: str, imports: bool = True) -> DynamicSymbols | None:
        node = self.node(path)
        if node is None or node.elf is None:
            return None
        try:
            rfd = reopen_regular(self._lookup(path), path)
        except OSError:
            return None
        with open(rfd, "rb") as f:
            try:
                return read_dynamic_symbols(f, node.elf, imports)
            except BinfmtError:  # over the symbol reader's budget: unknown, like None
                return None

    def listdir(self, path: str) -> list[str]:
        try:
            fd = self._lookup(path)
        except OSError:
            return []
        try:
            dfd = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return []
        finally:
            os.close(fd)
        try:
            names: list[str] = []
            with os.scandir(dfd) as it:
                for entry in it:
                    names.append(entry.name)
                    if len(names) >= MAX_DIR_ENTRIES:
                        break
            return sorted(names)
        except OSError:
            return []
        finally:
            os.close(dfd)

    def files(self) -> Iterator[tuple[str, int]]:
        """Not walked: the node only looks at one executable and what it loads."""
        return iter(())
