"""A root filesystem on disk, read through lstat and readlink: never followed by the OS."""

from __future__ import annotations

import io
import operator
import os
import stat
from collections.abc import Iterator
from typing import Any

from execwatch.binfmt.symbols import DynamicSymbols
from execwatch.runnable.fs import Node, Resolved, describe_file, read_symbols


class _CountingFile(io.FileIO):
    """Counts the bytes actually read from disk, for the benchmark's "bytes read"."""

    count = 0

    def readinto(self, buffer: Any) -> int | None:
        n = super().readinto(buffer)
        self.count += n or 0
        return n


class DirectoryFS:
    """A root filesystem on disk. Symlinks are read with readlink, never followed by the OS."""

    def __init__(self, root: str) -> None:
        self.root = os.path.realpath(root)
        self.cache: dict[str, Node | None] = {}
        self.link_cache: dict[str, Resolved] = {}
        self.bytes_read = 0

    def _host(self, path: str) -> str:
        return self.root + path if path != "/" else self.root

    def node(self, path: str) -> Node | None:
        if path in self.cache:
            return self.cache[path]
        node = self._load(path)
        self.cache[path] = node
        return node

    def _load(self, path: str) -> Node | None:
        host = self._host(path)
        try:
            st = os.lstat(host)
        except OSError:
            return None
        if stat.S_ISLNK(st.st_mode):
            return Node("symlink", target=os.readlink(host))
        if stat.S_ISDIR(st.st_mode):
            return Node("dir", stat.S_IMODE(st.st_mode))
        if not stat.S_ISREG(st.st_mode):
            return Node("other", stat.S_IMODE(st.st_mode))
        try:
            fd = os.open(host, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return Node("file", stat.S_IMODE(st.st_mode), st.st_size)
        raw = _CountingFile(fd, "rb")
        mode = stat.S_IMODE(st.st_mode)
        try:
            with io.BufferedReader(raw, 4096) as f:
                return describe_file(path, f, st.st_size, mode)
        except OSError as exc:
            node = Node("file", mode, st.st_size)
            node.elf_error = f"unreadable: {exc.strerror}"
            return node
        finally:
            self.bytes_read += raw.count

    def dynamic_symbols(self, path: str, imports: bool = True) -> DynamicSymbols | None:
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
        return read_symbols(self.node(path), lambda: os.open(self._host(path), flags), imports)

    def listdir(self, path: str) -> list[str]:
        try:
            return sorted(os.listdir(self._host(path)))
        except OSError:
            return []

    def files(self) -> Iterator[tuple[str, int]]:
        stack = ["/"]
        while stack:
            directory = stack.pop()
            prefix = directory if directory == "/" else directory + "/"
            try:
                with os.scandir(self._host(directory)) as it:
                    entries = sorted(it, key=_name)
            except OSError:
                continue
            subdirs = []
            for entry in entries:
                try:
                    if entry.is_dir(follow_symlinks=False):
                        subdirs.append(prefix + entry.name)
                    elif entry.is_file(follow_symlinks=False):
                        yield (
                            prefix + entry.name,
                            entry.stat(follow_symlinks=False).st_mode & 0o7777,
                        )
                except OSError:
                    continue
            stack.extend(reversed(subdirs))


_name = operator.attrgetter("name")


ROOT_MARKERS = ("bin", "usr", "etc")


def looks_like_root(directory: str) -> bool:
    """A root filesystem has a loader (lib*/ld-*), /bin, /usr or /etc; a build's output
    (./dist, ./bin) has none of them."""
    if any(os.path.lexists(os.path.join(directory, name)) for name in ROOT_MARKERS):
        return True
    for lib in ("lib", "lib64"):
        try:
            names = os.listdir(os.path.join(directory, lib))
        except OSError:
            continue
        if any(name.startswith(("ld-", "ld64")) for name in names):
            return True
    return False
