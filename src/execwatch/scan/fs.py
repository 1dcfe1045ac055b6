"""A read-only view of an image's root filesystem, and path resolution confined to it.

Two views implement it: `MemoryFS`, built by applying layers (nothing from a tar is ever
written to disk), and `DirectoryFS`, a root filesystem on disk read through lstat/readlink
so that a symlink is always resolved against the image root and never against the host.
"""

from __future__ import annotations

import io
import operator
import os
import posixpath
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO, Protocol

from execwatch.binfmt import BinfmtError, ElfInfo, read_elf, sniff
from execwatch.binfmt.symbols import DynamicSymbols, read_dynamic_symbols
from execwatch.scan.errors import LimitExceeded, ScanInputError
from execwatch.scan.limits import Limits

HEAD_BYTES = 256  # what the kernel's binfmt handlers look at (BINPRM_BUF_SIZE)
SMALL_TEXT_BYTES = 64 << 10  # ld.so.conf, ld-musl-*.path and friends
MAX_SYMLINKS = 40  # Linux's MAXSYMLINKS
MAX_WALK_STEPS = 8192  # path components walked by one resolution, links included


@dataclass
class Node:
    """One entry of the merged filesystem. `elf` is filled for ELF files (or `elf_error`)."""

    kind: str  # "file", "dir", "symlink", "other"
    mode: int = 0o644
    size: int = 0
    target: str | None = None  # symlink target
    head: bytes = b""
    elf: ElfInfo | None = None
    elf_error: str | None = None
    text: bytes | None = None  # kept for small loader configuration files (wants_text)

    @property
    def executable(self) -> bool:
        return self.kind == "file" and bool(self.mode & 0o111)


class FileSystem(Protocol):
    def node(self, path: str) -> Node | None:
        """The entry at a normalised absolute path, without following a final symlink."""

    def listdir(self, path: str) -> list[str]: ...

    def files(self) -> Iterator[tuple[str, int]]:
        """Every regular file and its permission bits, in a stable order, without reading it."""


def normalise(path: str) -> str:
    """Make `path` absolute and clean, clamping `..` at the root as a chroot would."""
    return posixpath.normpath("/" + path).replace("//", "/")


class SymlinkLoop(ScanInputError):
    pass


_Resolved = tuple[str | None, int]  # (canonical path or None, symlinks followed)
_IN_PROGRESS: _Resolved = (None, -1)


def resolve(fs: FileSystem, path: str) -> str | None:
    """Follow symlinks in every component of `path` inside the image root.

    Returns the resolved path of an existing entry, or None when something is missing.
    Raises SymlinkLoop (an input error) after MAX_SYMLINKS links, as the kernel gives ELOOP,
    and LimitExceeded after MAX_WALK_STEPS components (40 links of 4 KiB of `x/../` would
    otherwise cost 64k lookups). Each symlink is resolved once per file system (kept in
    `fs.link_cache` where the view has one), not once per path through it.
    """
    cache: dict[str, _Resolved] | None = getattr(fs, "link_cache", None)
    return _Walk(fs, {} if cache is None else cache).path("/", normalise(path))[0]


class _Walk:
    def __init__(self, fs: FileSystem, cache: dict[str, _Resolved]) -> None:
        self.fs = fs
        self.cache = cache
        self.steps = 0
        self.nesting = 0  # links being resolved inside one another: bounds the recursion

    def path(self, start: str, path: str) -> _Resolved:
        current = "/" if path.startswith("/") else start
        parts = [p for p in path.split("/") if p and p != "."]
        self.steps += len(parts)
        if self.steps > MAX_WALK_STEPS:
            raise LimitExceeded(f"resolving {path[:64]!r} takes more than {MAX_WALK_STEPS} steps")
        hops = 0
        for i, part in enumerate(parts):
            if part == "..":
                current = current.rpartition("/")[0] or "/"
                continue
            candidate = current + part if current == "/" else current + "/" + part
            node = self.fs.node(candidate)
            if node is None:
                return None, hops
            if node.kind == "symlink":
                target, taken = self.link(candidate, node.target or "")
                hops += taken
                if hops > MAX_SYMLINKS:
                    raise SymlinkLoop(f"symlink loop at {candidate}")
                if target is None:
                    return None, hops
                current = target
                continue
            if i + 1 < len(parts) and node.kind != "dir":
                return None, hops
            current = candidate
        return current, hops

    def link(self, path: str, target: str) -> _Resolved:
        found = self.cache.get(path)
        if found is _IN_PROGRESS:
            raise SymlinkLoop(f"symlink loop at {path}")
        if found is None:
            if self.nesting >= MAX_SYMLINKS:  # each one a link followed: the kernel's ELOOP
                raise SymlinkLoop(f"symlink loop at {path}: more than {MAX_SYMLINKS} links nested")
            self.cache[path] = _IN_PROGRESS
            self.nesting += 1
            try:
                real, hops = self.path(path.rpartition("/")[0] or "/", target)
            except ScanInputError:
                del self.cache[path]
                raise
            finally:
                self.nesting -= 1
            found = self.cache[path] = (real, hops + 1)
        return found


class MemoryFS:
    """The merged result of applying image layers, held in memory (metadata and headers).

    Every walk over the tree is a loop, never a recursion, and the tree is bounded in
    depth, entries and path bytes (Limits.max_tree_*): a member 100,000 directories deep
    is a LimitExceeded, not a RecursionError. `steps` counts the loop iterations, so the
    cost of building a tree can be measured rather than timed.
    """

    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        self.nodes: dict[str, Node] = {"/": Node("dir", 0o755)}
        self.children: dict[str, set[str]] = {"/": set()}
        self.text_bytes = 0  # configuration text kept, over all layers (Limits.max_text_bytes)
        self.link_cache: dict[str, _Resolved] = {}  # resolve(): cleared on every change
        self.path_bytes = 0
        self.steps = 0

    def node(self, path: str) -> Node | None:
        return self.nodes.get(path)

    def listdir(self, path: str) -> list[str]:
        return sorted(self.children.get(path, ()))

    def files(self) -> Iterator[tuple[str, int]]:
        for path in sorted(self.nodes):
            node = self.nodes[path]
            if node.kind == "file":
                yield path, node.mode

    def put(self, path: str, node: Node) -> None:
        """Add or replace `path`, creating missing parents (and replacing a non-directory
        in the way); a directory put over a directory keeps its children."""
        if path.count("/") > self.limits.max_tree_depth:
            raise LimitExceeded(f"{path[:64]!r}…: deeper than {self.limits.max_tree_depth}")
        self.link_cache.clear()
        missing = []
        parent = posixpath.dirname(path)
        while parent != "/" and not self._is_dir(parent):
            missing.append(parent)
            parent = posixpath.dirname(parent)
            self.steps += 1
        for directory in reversed(missing):
            self.remove(directory)
            self._link(directory, Node("dir", 0o755))
        if node.kind != "dir" or not self._is_dir(path):
            self.remove(path)
        self._link(path, node)

    def _is_dir(self, path: str) -> bool:
        existing = self.nodes.get(path)
        return existing is not None and existing.kind == "dir"

    def _link(self, path: str, node: Node) -> None:
        if path not in self.nodes:
            self.path_bytes += len(path)
            if len(self.nodes) >= self.limits.max_tree_nodes:
                raise LimitExceeded(f"more than {self.limits.max_tree_nodes} entries in the image")
            if self.path_bytes > self.limits.max_tree_path_bytes:
                raise LimitExceeded(
                    f"more than {self.limits.max_tree_path_bytes} bytes of paths in the image"
                )
        self.steps += 1
        self.nodes[path] = node
        self.children[posixpath.dirname(path)].add(posixpath.basename(path))
        if node.kind == "dir":
            self.children.setdefault(path, set())

    def remove(self, path: str) -> None:
        """Remove `path` and everything under it: one visit per entry removed."""
        if path == "/" or path not in self.nodes:
            return
        self.link_cache.clear()
        self.children[posixpath.dirname(path)].discard(posixpath.basename(path))
        stack = [path]
        while stack:
            current = stack.pop()
            self.steps += 1
            del self.nodes[current]
            self.path_bytes -= len(current)
            stack.extend(current + "/" + child for child in self.children.pop(current, ()))

    def clear_dir(self, path: str) -> None:
        for child in list(self.children.get(path, ())):
            self.remove(posixpath.join(path, child))


def wants_text(path: str, size: int) -> bool:
    """ld.so.conf, its includes and ld-musl-*.path: small *.conf / *.path files under etc/."""
    return size <= SMALL_TEXT_BYTES and "/etc/" in path and path.endswith((".conf", ".path"))


def describe_file(path: str, data: BinaryIO, size: int, mode: int) -> Node:
    """Build a file node from seekable content: its head, ELF headers or small config text."""
    head = data.read(HEAD_BYTES)
    node = Node("file", mode, size, head=head)
    if sniff(head) == "elf":
        try:
            node.elf = read_elf(data)
        except BinfmtError as exc:
            node.elf_error = str(exc)
    elif wants_text(path, size):
        data.seek(0)
        node.text = data.read(SMALL_TEXT_BYTES)
    return node


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
        self.link_cache: dict[str, _Resolved] = {}
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
        node = self.node(path)
        if node is None or node.elf is None:
            return None
        try:
            fd = os.open(self._host(path), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return None
        with os.fdopen(fd, "rb") as f:
            try:
                return read_dynamic_symbols(f, node.elf, imports)
            except BinfmtError:  # over the symbol reader's budget: unknown, like None
                return None

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
