"""A live map from cgroup id to cgroup path that outlives the cgroups themselves.

A container whose entrypoint has the wrong architecture is gone, cgroup and all, a
few milliseconds after the failed exec; by the time user space reads the event the
id may name nothing. So the inventory learns every cgroup directory when it is
created (inotify on the whole cgroup2 tree), remembers the ones deleted recently
in a bounded LRU, and rescans periodically in case inotify missed something
(queue overflow, watch limit). Lookups are a dict access under a lock.
"""

from __future__ import annotations

import errno
import logging
import os
import select
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from cachetools import LRUCache

from execwatch.attribution.handles import HandleResolver
from execwatch.attribution.inotify import (
    IN_CREATE,
    IN_DELETE,
    IN_DELETE_SELF,
    IN_IGNORED,
    IN_ISDIR,
    IN_MOVE_SELF,
    IN_MOVED_FROM,
    IN_MOVED_TO,
    IN_ONLYDIR,
    IN_Q_OVERFLOW,
    Inotify,
)
from execwatch.attribution.mounts import HierarchyMount

log = logging.getLogger(__name__)

WATCH_MASK = (
    IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR
)
NewCgroupHook = Callable[[int, str], None]


@dataclass(frozen=True, slots=True)
class CgroupEntry:
    cgroup_id: int
    path: str  # inside the hierarchy: "/" is the root cgroup
    alive: bool


@dataclass(frozen=True, slots=True)
class InventoryStats:
    live: int
    recently_deleted: int
    watches: int
    rescans: int
    overflows: int
    watch_failures: int


class CgroupInventory:
    """Thread-safe id -> path map of one cgroup2 hierarchy. ``start()`` before ``lookup()``."""

    def __init__(
        self,
        mount: HierarchyMount,
        *,
        recent_capacity: int = 16384,
        rescan_interval: float = 60.0,
        use_handles: bool = True,
        watch: bool = True,
        nice: int | None = -10,
        on_new_cgroup: NewCgroupHook | None = None,
    ) -> None:
        self.mount = mount
        self._rescan_interval = rescan_interval
        self._use_handles = use_handles
        self._watch = watch
        self._nice = nice
        self._on_new_cgroup = on_new_cgroup
        self._lock = threading.Lock()
        self._live: dict[int, str] = {}
        self._by_path: dict[str, int] = {}
        self._recent: LRUCache[int, str] = LRUCache(recent_capacity)
        self._wd_path: dict[int, str] = {}
        self._path_wd: dict[str, int] = {}
        self._rescans = 0
        self._overflows = 0
        self._watch_failures = 0
        self._inotify: Inotify | None = None
        self._handles: HandleResolver | None = None
        self._thread: threading.Thread | None = None
        self._wake_r, self._wake_w = -1, -1
        self._stopping = threading.Event()

    def start(self) -> None:
        """Scan the tree now (lookups work as soon as this returns), then follow it."""
        if self._watch:
            self._inotify = Inotify()
        if self._use_handles:
            try:
                self._handles = HandleResolver(self.mount)
            except OSError as exc:
                log.warning("cgroup handles unavailable", extra={"error": str(exc)})
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._add_tree("/")
        self._thread = threading.Thread(target=self._run, name="cgroup-inventory", daemon=True)
        self._thread.start()
        log.info(
            "cgroup inventory started",
            extra={"mount": str(self.mount.mountpoint), "cgroups": len(self._live)},
        )

    def close(self) -> None:
        self._stopping.set()
        if self._wake_w >= 0:
            os.write(self._wake_w, b"x")
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        for fd in (self._wake_r, self._wake_w):
            if fd >= 0:
                os.close(fd)
        self._wake_r = self._wake_w = -1
        if self._inotify is not None:
            self._inotify.close()
            self._inotify = None
        if self._handles is not None:
            self._handles.close()
            self._handles = None

    def lookup(self, cgroup_id: int) -> CgroupEntry | None:
        """The cgroup's path, alive or recently deleted; None if never seen."""
        with self._lock:
            path = self._live.get(cgroup_id)
            if path is not None:
                return CgroupEntry(cgroup_id, path, alive=True)
            path = self._recent.get(cgroup_id)  # an LRU hit: now the newest
            if path is not None:
                return CgroupEntry(cgroup_id, path, alive=False)
        handles = self._handles
        if handles is not None:
            path = handles.path_of(cgroup_id)
            if path is not None:
                with self._lock:
                    self._record(cgroup_id, path)
                return CgroupEntry(cgroup_id, path, alive=True)
        return None

    def stats(self) -> InventoryStats:
        with self._lock:
            return InventoryStats(
                live=len(self._live),
                recently_deleted=len(self._recent),
                watches=len(self._wd_path),
                rescans=self._rescans,
                overflows=self._overflows,
                watch_failures=self._watch_failures,
            )

    def rescan(self) -> None:
        """Reconcile with the file system: learn what was missed, retire what is gone."""
        seen: dict[str, int] = {}
        stack = ["/"]
        while stack:
            path = stack.pop()
            fs_path = self.mount.to_fs_path(path)
            if fs_path is None:
                continue
            try:
                seen[path] = os.stat(fs_path).st_ino
                children = [e.name for e in os.scandir(fs_path) if e.is_dir(follow_symlinks=False)]
            except OSError:
                continue
            stack.extend(_join(path, name) for name in children)
        for path, cgroup_id in seen.items():
            watched = path in self._path_wd or self._inotify is None
            if self._by_path.get(path) != cgroup_id or not watched:
                self._add_one(path)
        with self._lock:
            self._rescans += 1
            gone = [cid for cid, p in self._live.items() if seen.get(p) != cid]
            for cid in gone:
                self._retire(cid)

    def _run(self) -> None:
        if self._nice is not None:
            # A container that dies at once leaves this thread a few milliseconds to stat its
            # cgroup: on a busy node, that needs a place ahead of the workload in the run queue.
            try:
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self._nice)
            except OSError as exc:
                log.info("cannot raise the inventory thread's priority", extra={"error": str(exc)})
        next_rescan = time.monotonic() + self._rescan_interval
        inotify_fd = self._inotify.fd if self._inotify is not None else -1
        fds = [fd for fd in (inotify_fd, self._wake_r) if fd >= 0]
        while not self._stopping.is_set():
            timeout = max(0.0, next_rescan - time.monotonic())
            try:
                ready, _, _ = select.select(fds, [], [], timeout)
            except OSError as exc:
                log.error("inventory poll failed", extra={"error": str(exc)})
                return
            if self._stopping.is_set():
                return
            if inotify_fd in ready:
                try:
                    self._drain()
                except Exception:
                    log.exception("inventory event handling failed; rescanning")
                    self.rescan()
            if time.monotonic() >= next_rescan:
                self.rescan()
                next_rescan = time.monotonic() + self._rescan_interval

    def _drain(self) -> None:
        assert self._inotify is not None
        for event in self._inotify.read():
            if event.mask & IN_Q_OVERFLOW:
                with self._lock:
                    self._overflows += 1
                log.warning("inotify queue overflowed; rescanning cgroups")
                self.rescan()
                continue
            parent = self._wd_path.get(event.wd)
            if event.mask & IN_IGNORED:
                self._forget_watch(event.wd)
                continue
            if parent is None:
                continue
            if event.mask & (IN_MOVE_SELF | IN_MOVED_FROM | IN_MOVED_TO):
                self.rescan()  # a renamed cgroup: paths below it all changed
                continue
            if not event.mask & IN_ISDIR or not event.name:
                continue
            child = _join(parent, event.name)
            if event.mask & IN_CREATE:
                self._add_tree(child)
            elif event.mask & IN_DELETE:
                with self._lock:
                    cgroup_id = self._by_path.get(child)
                    if cgroup_id is not None:
                        self._retire(cgroup_id)

    def _add_tree(self, top: str) -> None:
        """Watch ``top`` first, then list it, so that no child created meanwhile is missed."""
        stack = [top]
        while stack:
            path = stack.pop()
            if not self._add_one(path):
                continue
            fs_path = self.mount.to_fs_path(path)
            if fs_path is None:
                continue
            try:
                names = [e.name for e in os.scandir(fs_path) if e.is_dir(follow_symlinks=False)]
            except OSError:
                continue
            stack.extend(_join(path, name) for name in names)

    def _add_one(self, path: str) -> bool:
        fs_path = self.mount.to_fs_path(path)
        if fs_path is None:
            return False
        wd: int | None = None
        try:
            if self._inotify is not None:
                wd = self._inotify.add_watch(str(fs_path), WATCH_MASK)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                return False
            with self._lock:
                self._watch_failures += 1
            if self._watch_failures == 1:
                log.warning(
                    "cannot watch cgroup; relying on rescans",
                    extra={"path": path, "error": exc.strerror},
                )
        try:
            cgroup_id = os.stat(fs_path).st_ino
        except OSError:
            return False  # removed before we looked: only the BPF-time handle lookup can help
        with self._lock:
            if wd is not None:
                self._wd_path[wd] = path
                self._path_wd[path] = wd
            new = cgroup_id not in self._live
            self._record(cgroup_id, path)
        if new and self._on_new_cgroup is not None:
            try:
                self._on_new_cgroup(cgroup_id, path)
            except Exception:
                log.exception("new-cgroup hook failed", extra={"path": path})
        return True

    def _record(self, cgroup_id: int, path: str) -> None:
        old = self._by_path.get(path)
        if old is not None and old != cgroup_id:
            self._retire(old)  # same name, new directory: the old one was removed unseen
        self._live[cgroup_id] = path
        self._by_path[path] = cgroup_id
        self._recent.pop(cgroup_id, None)

    def _retire(self, cgroup_id: int) -> None:
        path = self._live.pop(cgroup_id, None)
        if path is None:
            return
        if self._by_path.get(path) == cgroup_id:
            del self._by_path[path]
            wd = self._path_wd.pop(path, None)
            if wd is not None:
                self._wd_path.pop(wd, None)
                if self._inotify is not None:
                    self._inotify.rm_watch(wd)  # kernfs may not send IN_IGNORED for a while
        self._recent[cgroup_id] = path

    def _forget_watch(self, wd: int) -> None:
        with self._lock:
            path = self._wd_path.pop(wd, None)
            if path is not None and self._path_wd.get(path) == wd:
                del self._path_wd[path]


def _join(parent: str, name: str) -> str:
    return f"{parent.rstrip('/')}/{name}"
