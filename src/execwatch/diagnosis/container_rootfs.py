"""Where a container's root filesystem is mounted, from its container id.

When a container's entrypoint fails, its only process exits and no task is left whose
/proc/PID/root shows the image. The runtime keeps the rootfs mounted a little longer:
containerd (and Docker through it) mounts it at a path that contains the container id;
CRI-O records it in the container's config.json. Candidates are only suggestions:
RootLocator accepts one only if it is the very root directory the kernel reported.

The mount lives in the mount namespace of the runtime's shim, which is the failed task's
parent. That is usually the host's, seen through init (/proc/1, as a hostPID agent must),
but init may be out of reach (a sandboxed or non-dumpable init) and the runtime may run
in a namespace of its own, so the parent's view is read too, then our own (execwatch
trace on a host).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from typing import BinaryIO, NamedTuple

from execwatch.attribution.mounts import unescape_mountinfo
from execwatch.runnable.openat2 import Resolver, Root

CONTAINER_ID = re.compile(r"^[0-9a-f]{12,128}$")
CRIO_CONFIG = "/run/containers/storage/overlay-containers/{id}/userdata/config.json"
MAX_MOUNTINFO_BYTES = 8 << 20  # ~50,000 mounts; a namespace a tenant fills is read no further
MAX_CONFIG_BYTES = 1 << 20  # a CRI-O config.json is a few KiB
MAX_CANDIDATES = 16  # mounts naming one container id: its rootfs and a few volumes


class Candidate(NamedTuple):
    """A mount path inside the root of a /proc view: opened there with RESOLVE_IN_ROOT
    (roots.py), so a symlink on the way, in a namespace a tenant may own, stays inside it."""

    view_root: Path  # /proc/PID/root
    inside: str  # absolute, as that task sees it

    @property
    def path(self) -> Path:
        return self.view_root / self.inside.lstrip("/")


class ContainerRootfs:
    """Looks in the mount tables of init, the failed task's parent and ourselves, and in
    CRI-O's state."""

    def __init__(self, proc: Path = Path("/proc")) -> None:
        self._proc = proc
        self._resolver = Resolver()

    def candidates(self, container_id: str | None, parent: int = 0) -> Iterator[Candidate]:
        if not container_id or not CONTAINER_ID.fullmatch(container_id):
            return
        for view in self._views(parent):
            yield from self._from_mounts(view, container_id)
            yield from self._from_crio(view, container_id)

    def in_filesystem(self, dev: int, fs_path: str | None, parent: int = 0) -> Iterator[Candidate]:
        """Where a root the kernel placed in its filesystem (`fs_path` on device `dev`, as
        st_dev) shows through a mount of that filesystem: a runtime's directory rootfs
        (runc's bundle, a snapshot) outlives the container whose root it was."""
        if not dev or fs_path is None:
            return
        for view in self._views(parent):
            yield from islice(self._from_filesystem(view, dev, fs_path), MAX_CANDIDATES)

    def _views(self, parent: int) -> Iterator[Path]:
        """/proc/PID of each reachable task with a mount namespace not seen before."""
        seen: set[int] = set()
        for pid in ("1", *([str(parent)] if parent > 0 else []), "self"):
            view = self._proc / pid
            try:
                namespace = os.stat(view / "ns" / "mnt").st_ino
                os.stat(view / "root")  # followed, so only with ptrace access to the task
            except OSError:
                continue
            if namespace not in seen:
                seen.add(namespace)
                yield view

    def _from_mounts(self, view: Path, container_id: str) -> Iterator[Candidate]:
        needle = f"/{container_id}/".encode()
        try:
            with open(view / "mountinfo", "rb") as f:
                matches = (
                    fields[4]
                    for line in _lines(f, MAX_MOUNTINFO_BYTES)
                    if len(fields := line.split(b" ", 5)) > 4 and needle in fields[4] + b"/"
                )
                found = list(islice(matches, MAX_CANDIDATES))
        except OSError:
            return
        for mountpoint in found:
            yield _inside(view, mountpoint.decode(errors="surrogateescape").replace("\\040", " "))

    def _from_filesystem(self, view: Path, dev: int, fs_path: str) -> Iterator[Candidate]:
        """Mounts of device `dev` whose mounted subtree (mountinfo's root field) holds
        fs_path, and where fs_path shows in each."""
        wanted = f"{os.major(dev)}:{os.minor(dev)}".encode()
        try:
            with open(view / "mountinfo", "rb") as f:
                found = [
                    (_field(fields[3]), _field(fields[4]))
                    for line in _lines(f, MAX_MOUNTINFO_BYTES)
                    if len(fields := line.split(b" ", 5)) > 4 and fields[2] == wanted
                ]
        except OSError:
            return
        for subtree, mountpoint in found:
            inside = _below(fs_path, subtree)
            if inside is not None:
                yield _inside(view, f"{mountpoint.rstrip('/')}/{inside}")

    def _from_crio(self, view: Path, container_id: str) -> Iterator[Candidate]:
        """The config is read inside the view's root: a parent's may be a tenant's, whose
        symlinks must not lead to the node's files, nor a FIFO block the read."""
        try:
            fd = os.open(view / "root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            root_dir = Root(fd, str(view))
            try:
                config = self._resolver.open_regular(root_dir, CRIO_CONFIG.format(id=container_id))
            finally:
                root_dir.close()
            with os.fdopen(config, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size > MAX_CONFIG_BYTES:
                    return
                root = json.loads(f.read(size))["root"]["path"]
        except (OSError, ValueError, KeyError, TypeError, RecursionError):
            return
        if isinstance(root, str) and root.startswith("/"):
            yield _inside(view, root)


def _lines(f: BinaryIO, budget: int) -> Iterator[bytes]:
    """Lines of at most 64 KiB (a mountinfo line is below 3 * PATH_MAX), within budget bytes."""
    while budget > 0 and (line := f.readline(min(budget, 1 << 16))):
        budget -= len(line)
        yield line.rstrip(b"\n")


def _field(raw: bytes) -> str:
    return unescape_mountinfo(raw.decode(errors="surrogateescape"))


def _below(path: str, top: str) -> str | None:
    """`path` relative to `top` ("" for top itself), or None when it is not inside it."""
    top = top.rstrip("/")
    if path == top or (not top and path == "/"):
        return ""
    if path.startswith(top + "/"):
        return path[len(top) + 1 :]
    return None


def _inside(view: Path, path: str) -> Candidate:
    return Candidate(view / "root", "/" + path.lstrip("/"))
