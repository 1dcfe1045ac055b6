"""An image's layer stack, applied in memory: metadata, headers and small configuration."""

from __future__ import annotations

import posixpath
from collections.abc import Iterator

from execwatch.runnable.errors import LimitExceeded
from execwatch.runnable.fs import Node, Resolved
from execwatch.runnable.limits import Limits


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
        self.link_cache: dict[str, Resolved] = {}  # resolve(): cleared on every change
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
