"""Finding a live view of the failing task's root filesystem.

The caller of a failed exec is often gone by the time user space looks: a container
whose entrypoint fails exits at once. So the failing task itself is tried first, then
any live task of the same mount namespace, then whatever extra locators the host
offers (for example a container runtime's bundle rootfs).
"""

from __future__ import annotations

import os
import posixpath
from collections import OrderedDict
from collections.abc import Callable, Iterable
from pathlib import Path

from execwatch.diagnosis.confined import Root
from execwatch.record import KernelEvent

ExtraLocator = Callable[[KernelEvent], Iterable[Path]]


class RootLocator:
    """Opens an O_PATH fd on the root of the task that failed, or of a live peer."""

    def __init__(self, proc: Path = Path("/proc"), extra: Iterable[ExtraLocator] = ()) -> None:
        self._proc = proc
        self._extra = list(extra)
        self._peer_by_mntns: OrderedDict[int, int] = OrderedDict()  # bounded LRU

    def open(self, event: KernelEvent) -> Root | None:
        for pid in (event.tgid, event.ppid):  # the parent usually forked the caller
            root = self._open_pid_root(pid, event.mntns)
            if root:
                self._remember(event.mntns, pid)
                return root
        peer = self._find_peer(event.mntns)
        if peer is not None:
            root = self._open_pid_root(peer, event.mntns)
            if root:
                return Root(root.fd, f"root of pid {peer}, a live task of the same mount namespace")
        for locate in self._extra:
            for path in locate(event):
                try:
                    return Root(
                        os.open(path, os.O_PATH | os.O_DIRECTORY), f"container rootfs {path}"
                    )
                except OSError:
                    continue
        return None

    def cwd_in_root(self, pid: int) -> str | None:
        """The task's working directory as a path inside its own root."""
        try:
            root = os.readlink(self._proc / str(pid) / "root")
            cwd = os.readlink(self._proc / str(pid) / "cwd")
        except OSError:
            return None
        if root == "/":
            return cwd
        if cwd == root or cwd.startswith(root + "/"):
            return "/" + cwd[len(root) :].lstrip("/")
        return None

    def absolute(self, event: KernelEvent, path: str) -> str | None:
        """A relative path joined to the caller's cwd, or its parent's once the caller is gone."""
        if path.startswith("/"):
            return path
        cwd = self.cwd_in_root(event.tgid) or self._parent_cwd(event)
        return posixpath.join(cwd, path) if cwd else None

    def _parent_cwd(self, event: KernelEvent) -> str | None:
        return self.cwd_in_root(event.ppid) if self._in_mntns(event.ppid, event.mntns) else None

    def _open_pid_root(self, pid: int, mntns: int) -> Root | None:
        base = self._proc / str(pid)
        try:
            fd = os.open(base / "root", os.O_PATH | os.O_DIRECTORY)
        except OSError:
            return None
        try:  # the pid may have been reused by a task of another namespace
            if mntns and os.stat(base / "ns" / "mnt").st_ino != mntns:
                os.close(fd)
                return None
        except OSError:
            os.close(fd)
            return None
        return Root(fd, f"root of pid {pid}")

    def _find_peer(self, mntns: int) -> int | None:
        if not mntns:
            return None
        cached = self._peer_by_mntns.get(mntns)
        if cached is not None and self._in_mntns(cached, mntns):
            return cached
        for entry in os.scandir(self._proc):
            if entry.name.isdigit() and self._in_mntns(int(entry.name), mntns):
                self._remember(mntns, int(entry.name))
                return int(entry.name)
        return None

    def _in_mntns(self, pid: int, mntns: int) -> bool:
        try:
            return os.stat(self._proc / str(pid) / "ns" / "mnt").st_ino == mntns
        except OSError:
            return False

    def _remember(self, mntns: int, pid: int, limit: int = 4096) -> None:
        self._peer_by_mntns[mntns] = pid
        self._peer_by_mntns.move_to_end(mntns)
        while len(self._peer_by_mntns) > limit:
            self._peer_by_mntns.popitem(last=False)
