"""A read-only view of a root filesystem, and path resolution confined to it.

Three views implement FileSystem: `MemoryFS` (memory.py), an image's layer stack applied
in memory (nothing from a tar is ever written to disk); `DirectoryFS` (directory.py), a
root filesystem on disk read through lstat/readlink so that a symlink is always resolved
against the image root and never against the host; and `RootView` (liveroot.py), a live
task's root read through openat2. The linker and the rules run on any of them.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO, Protocol

from execwatch.binfmt import BinfmtError, ElfInfo, read_elf, sniff
from execwatch.binfmt.foreign import ForeignBinary, identify_stream
from execwatch.binfmt.shebang import BINPRM_BUF_SIZE
from execwatch.binfmt.symbols import DynamicSymbols, read_dynamic_symbols
from execwatch.runnable.errors import InputError, LimitExceeded

# What the kernel's binfmt handlers look at: the whole `#!` line and the ELF header (the
# program headers are read from the file by read_elf, not from this head).
HEAD_BYTES = BINPRM_BUF_SIZE
SMALL_TEXT_BYTES = 64 << 10  # ld.so.conf, ld-musl-*.path and friends
MAX_SYMLINKS = 40  # Linux's MAXSYMLINKS
MAX_WALK_STEPS = 8192  # path components walked by one resolution, links included


@dataclass
class Node:
    """One entry of the merged filesystem. `elf` is filled for ELF files (or `elf_error`),
    `foreign` for other executables of another OS (Mach-O, PE, a.out)."""

    kind: str  # "file", "dir", "symlink", "other"
    mode: int = 0o644
    size: int = 0
    target: str | None = None  # symlink target
    head: bytes = b""
    elf: ElfInfo | None = None
    elf_error: str | None = None
    text: bytes | None = None  # kept for small loader configuration files (wants_text)
    foreign: ForeignBinary | None = None

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


class SymlinkLoop(InputError):
    pass


Resolved = tuple[str | None, int]  # (canonical path or None, symlinks followed)
_IN_PROGRESS: Resolved = (None, -1)


def resolve(fs: FileSystem, path: str) -> str | None:
    """Follow symlinks in every component of `path` inside the image root.

    Returns the resolved path of an existing entry, or None when something is missing.
    Raises SymlinkLoop (an input error) after MAX_SYMLINKS links, as the kernel gives ELOOP,
    and LimitExceeded after MAX_WALK_STEPS components (40 links of 4 KiB of `x/../` would
    otherwise cost 64k lookups). Each symlink is resolved once per file system (kept in
    `fs.link_cache` where the view has one), not once per path through it.
    """
    cache: dict[str, Resolved] | None = getattr(fs, "link_cache", None)
    return _Walk(fs, {} if cache is None else cache).path("/", normalise(path))[0]


class _Walk:
    def __init__(self, fs: FileSystem, cache: dict[str, Resolved]) -> None:
        self.fs = fs
        self.cache = cache
        self.steps = 0
        self.nesting = 0  # links being resolved inside one another: bounds the recursion

    def path(self, start: str, path: str) -> Resolved:
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

    def link(self, path: str, target: str) -> Resolved:
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
            except InputError:
                del self.cache[path]
                raise
            finally:
                self.nesting -= 1
            found = self.cache[path] = (real, hops + 1)
        return found


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
    elif mode & 0o111:
        node.foreign = identify_stream(head, data)
    return node


def read_symbols(
    node: Node | None, open_file: Callable[[], int], imports: bool
) -> DynamicSymbols | None:
    """An ELF node's dynamic symbols, read again through `open_file` (a read fd); None when
    unknown: not ELF, not readable, or over the symbol reader's budget."""
    if node is None or node.elf is None:
        return None
    try:
        fd = open_file()
    except OSError:
        return None
    with open(fd, "rb") as f:
        try:
            return read_dynamic_symbols(f, node.elf, imports)
        except BinfmtError:
            return None


class Placed:
    """`upper` placed at `at` over `lower`, as a build's COPY puts its files in an image.

    Paths resolve in the merged tree (a placed script's `#!/usr/bin/env` is the lower
    root's); `files()` lists the placed files only: they are what is checked, the lower
    root is what they run on. A path under `at` is the upper's when it has one."""

    def __init__(self, lower: FileSystem, upper: FileSystem, at: str) -> None:
        self.lower, self.upper = lower, upper
        self.at = normalise(at)
        self.prefix = "" if self.at == "/" else self.at
        self.link_cache: dict[str, Resolved] = {}

    def _inner(self, path: str) -> str | None:
        if path == self.at:
            return "/"
        if path.startswith(self.prefix + "/"):
            return path[len(self.prefix) :]
        return None

    def _holder(self, path: str) -> tuple[FileSystem, str]:
        inner = self._inner(path)
        if inner is not None and self.upper.node(inner) is not None:
            return self.upper, inner
        return self.lower, path

    def node(self, path: str) -> Node | None:
        fs, inner = self._holder(path)
        node = fs.node(inner)
        if (node is None or node.kind != "dir") and self.at.startswith(path.rstrip("/") + "/"):
            return Node("dir", 0o755)  # a parent of `at`: the build's COPY makes it
        return node

    def listdir(self, path: str) -> list[str]:
        names = set(self.lower.listdir(path))
        inner = self._inner(path)
        if inner is not None:
            names.update(self.upper.listdir(inner))
        elif self.at.startswith(path.rstrip("/") + "/"):
            names.add(self.at[len(path.rstrip("/")) + 1 :].split("/")[0])
        return sorted(names)

    def files(self) -> Iterator[tuple[str, int]]:
        for path, mode in self.upper.files():
            yield (self.prefix + path if path != "/" else self.at), mode

    def dynamic_symbols(self, path: str, imports: bool = True) -> DynamicSymbols | None:
        fs, inner = self._holder(path)
        read = getattr(fs, "dynamic_symbols", None)
        return read(inner, imports) if read is not None else None
