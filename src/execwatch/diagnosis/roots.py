"""Finding a live view of the failing task's root filesystem.

The caller of a failed exec is often gone by the time user space looks: a container
whose entrypoint fails exits at once. So the failing task itself is tried first, then
its parent, then whatever extra locators the host offers (a container's rootfs, found
from its id), then where the kernel placed the root in its file system (recorded when the
root is its mount namespace's own, as a container's is) through a mount of that device,
then any live task with the same root. A stand-in is
used only if its root directory is the very inode the kernel saw as the caller's root,
so a chroot'ed caller is never diagnosed against its parent's filesystem.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Callable, Iterable
from pathlib import Path

from cachetools import FIFOCache

from execwatch.diagnosis.container_rootfs import Candidate, ContainerRootfs
from execwatch.record import ExecFailed, KernelEvent
from execwatch.runnable.openat2 import Resolver, Root

AT_FDCWD = -100
ExtraLocator = Callable[[KernelEvent], Iterable[Candidate]]
# A root stood up from what a container engine recorded by the container's id (its image
# layers), when no live root is left: tried last, as its root is not the kernel's inode.
LastResort = Callable[[KernelEvent], Root | None]

PEERS_KEPT = 4096  # roots whose live stand-in is remembered, the oldest found forgotten first


class RootLocator:
    """Opens an O_PATH fd on the root of the task that failed, or of a live stand-in."""

    def __init__(
        self,
        proc: Path = Path("/proc"),
        extra: Iterable[ExtraLocator] = (),
        last: Iterable[LastResort] = (),
    ) -> None:
        self._proc = proc
        self._extra = list(extra)
        self._last = list(last)
        self._resolver = Resolver()
        self._rootfs = ContainerRootfs(proc)
        self._peer_by_root: FIFOCache[tuple[int, int], int] = FIFOCache(PEERS_KEPT)

    def open(self, event: KernelEvent) -> Root | None:
        if event.root_fd >= 0:  # opened by the agent before the worker took the event
            return Root(os.dup(event.root_fd), event.root_description)
        for pid in (event.tgid, event.ppid):
            root = self._open_pid_root(pid, event)
            if root:
                self._remember(event, pid)
                return root
        if root := self._open_recorded(event):
            return root
        for locate in self._extra:  # before the /proc scan: a dead container's rootfs goes fast
            for candidate in locate(event):
                if root := self._open_rootfs(candidate, event):
                    return root
        recorded = _recorded(event)
        found = self._rootfs.in_filesystem(
            recorded.root_dev if recorded else 0,
            recorded.root_fs_path if recorded else None,
            event.ppid,
        )
        for candidate in found:
            if root := self._open_rootfs(candidate, event):
                return root
        peer = self._find_peer(event)
        if peer is not None and (root := self._open_pid_root(peer, event)):
            return Root(root.fd, f"root of pid {peer}, a live task with the same root")
        for stand_up in self._last:
            if root := stand_up(event):
                return root
        return None

    def _open_recorded(self, event: KernelEvent) -> Root | None:
        """The root's path as the kernel recorded it (a chroot), when the caller was in the
        host's mount namespace: accepted only if it is still the very same directory."""
        host, recorded = self._host(), _recorded(event)
        if recorded is None or recorded.root_path is None or host is None:
            return None
        if event.mntns != host[0]:
            return None
        path = host[1] / recorded.root_path.lstrip("/")
        try:
            fd = os.open(path, os.O_PATH | os.O_DIRECTORY)
        except OSError:
            return None
        st = os.fstat(fd)
        if (st.st_ino, st.st_dev) == (event.root_ino, recorded.root_dev):
            return Root(fd, f"root {recorded.root_path} recorded by the kernel")
        os.close(fd)
        return None

    def _host(self) -> tuple[int, Path] | None:
        """(mount namespace inode, root) of the host: init's, or ours when init is hidden."""
        for pid in ("1", "self"):
            try:
                return os.stat(self._proc / pid / "ns" / "mnt").st_ino, self._proc / pid / "root"
            except OSError:
                continue
        return None

    def _open_rootfs(self, candidate: Candidate, event: KernelEvent) -> Root | None:
        try:
            view = Root(os.open(candidate.view_root, os.O_PATH | os.O_DIRECTORY), "")
        except OSError:
            return None
        try:  # inside that view's root: its symlinks cannot lead to the node's files
            fd = self._resolver.lookup(view, candidate.inside)
        except OSError:
            return None
        finally:
            view.close()
        st = os.fstat(fd)
        recorded = _recorded(event)  # deaths carry no dev
        same_dev = recorded is None or not recorded.root_dev or st.st_dev == recorded.root_dev
        if event.root_ino and st.st_ino == event.root_ino and same_dev:
            return Root(fd, f"container rootfs {candidate.path}")
        os.close(fd)  # without the kernel's root inode a guess could be any filesystem
        return None

    def absolute(self, event: ExecFailed, path: str) -> str | None:
        """A relative path joined to what the kernel resolved it against (dirfd or cwd, as
        recorded at the failure); else to the caller's cwd, or its parent's once it is gone."""
        if path.startswith("/"):
            return path
        if event.base_path is not None:
            return posixpath.join(event.base_path, path)
        if event.syscall == "execveat" and event.dirfd != AT_FDCWD:
            return None  # relative to a directory fd that was not recorded whole
        cwd = self._cwd_in_root(event.tgid)
        if cwd is None and self._same_root(event.ppid, event):
            cwd = self._cwd_in_root(event.ppid)
        return posixpath.join(cwd, path) if cwd else None

    def _cwd_in_root(self, pid: int) -> str | None:
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

    def _open_pid_root(self, pid: int, event: KernelEvent) -> Root | None:
        try:
            fd = os.open(self._proc / str(pid) / "root", os.O_PATH | os.O_DIRECTORY)
        except OSError:
            return None
        # Checked after opening, so the fd holds the root that passed the check.
        if self._same_root(pid, event) and (
            not event.root_ino or os.fstat(fd).st_ino == event.root_ino
        ):
            return Root(fd, f"root of pid {pid}")
        os.close(fd)
        return None

    def _same_root(self, pid: int, event: KernelEvent) -> bool:
        """Same mount namespace and same root directory inode as the failing task."""
        base = self._proc / str(pid)
        try:
            if event.mntns and os.stat(base / "ns" / "mnt").st_ino != event.mntns:
                return False
            return not event.root_ino or os.stat(base / "root").st_ino == event.root_ino
        except OSError:
            return False

    def _find_peer(self, event: KernelEvent) -> int | None:
        if not event.mntns:
            return None
        key = (event.mntns, event.root_ino)
        cached = self._peer_by_root.get(key)
        if cached is not None and self._same_root(cached, event):
            return cached
        for entry in os.scandir(self._proc):
            if entry.name.isdigit() and self._same_root(int(entry.name), event):
                self._remember(event, int(entry.name))
                return int(entry.name)
        return None

    def _remember(self, event: KernelEvent, pid: int) -> None:
        self._peer_by_root[(event.mntns, event.root_ino)] = pid


def _recorded(event: KernelEvent) -> ExecFailed | None:
    """The event that recorded where its root is (a failed exec's dentry chain)."""
    return event if isinstance(event, ExecFailed) else None
