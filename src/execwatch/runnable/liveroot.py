"""A live task's root filesystem as a FileSystem view, read through openat2.

The linker (linker.py) resolves libraries over any FileSystem: the scanner gives it an
image's layers or an unpacked root, the node gives it this live view, so both apply one
set of loader rules. Every lookup stays inside the root (RESOLVE_IN_ROOT, see
openat2.py), never follows a final symlink (the linker follows
them itself, inside the root), and reads only regular files. Bounded: the last MAX_NODES
entries described are kept (least recently used first out; an entry past the bound is
described again, never taken for missing), and MAX_DIR_ENTRIES names listed per directory.
How many lookups one diagnosis makes is the linker's budget (runnable.limits.Limits).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator

from cachetools import LRUCache

from execwatch.binfmt.symbols import DynamicSymbols
from execwatch.runnable.fs import Node, describe_file, read_symbols
from execwatch.runnable.openat2 import READ_FLAGS, MountGuard, Resolver, Root, reopen_regular

MAX_NODES = 4096
MAX_DIR_ENTRIES = 4096


class RootView:
    """runnable.fs.FileSystem over an O_PATH fd on a task's root."""

    def __init__(self, root: Root, slow: MountGuard | None = None) -> None:
        self._root = root
        self._slow = slow
        self._resolver = Resolver()
        self._cache: LRUCache[str, Node | None] = LRUCache(MAX_NODES)

    def _lookup(self, path: str) -> int:
        """An O_PATH fd, after `slow` (diagnosis/budget.py) has seen its mount: a hung file
        system is refused instead of blocking fstat and reads."""
        fd = self._resolver.lookup(self._root, path, follow=False)
        if self._slow is not None:
            try:
                self._slow.enter(fd)
            except BaseException:
                os.close(fd)
                raise
        return fd

    def node(self, path: str) -> Node | None:
        if path in self._cache:
            return self._cache[path]  # an LRU hit: now the newest
        node = self._cache[path] = self._load(path)
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
        return read_symbols(
            self.node(path), lambda: reopen_regular(self._lookup(path), path), imports
        )

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
