"""A Docker or Podman container's root rebuilt from its engine's overlay layers.

`docker run --rm` of a foreign image is gone within milliseconds: its task, its overlay
mount and its own (upper and init) layers with it. The image's layers stay: the engine's
graph driver named them (LowerDir, UpperDir) when the container was created, and the
attribution kept them. Stacked again as a read-only overlay, detached (fsopen + fsmount:
mounted nowhere, seen by no other process, gone when its fd closes), they are the root
the entrypoint was looked up in, minus the container's own writes.

Each layer directory is opened first (openat2, no magic links) and handed to overlayfs
by its fd (`lowerdir+`, Linux 6.13 and later), so no path is looked up twice and a colon
or comma in one is no separator.
"""

from __future__ import annotations

import contextlib
import ctypes
import os

from execwatch.attribution.engine_api import Layers
from execwatch.runnable.openat2 import Resolver, Root

SYS_FSOPEN = 430  # the same numbers on every architecture (the unified table)
SYS_FSCONFIG = 431
SYS_FSMOUNT = 432
FSOPEN_CLOEXEC = 0x1
FSCONFIG_SET_FD = 5
FSCONFIG_CMD_CREATE = 6
FSMOUNT_CLOEXEC = 0x1
MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
MOUNT_ATTR_NODEV = 0x4
MOUNT_ATTR_NOEXEC = 0x8


class EngineRoots:
    """Opens a container's image layers as one read-only root."""

    def __init__(self) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._libc.syscall.restype = ctypes.c_long
        self._resolver = Resolver()

    def open(self, container_id: str, layers: Layers) -> Root | None:
        """None when no layer is left or overlayfs refuses them (logged by the caller)."""
        dirs = self._open_layers(layers.top_first)
        description = f"image layers of container {container_id[:12]} (engine storage)"
        if len(dirs) == 1:  # one layer is its own root (overlayfs wants two, or an upper)
            return Root(dirs[0], description)
        try:
            if not dirs:
                return None
            fd = self._mount(dirs)
        except OSError:
            return None
        finally:
            for layer in dirs:
                os.close(layer)
        return Root(fd, description)

    def _open_layers(self, paths: tuple[str, ...]) -> list[int]:
        """The layers still on disk: a removed container's own upper and init layers are
        gone, its image's are not."""
        host = Root(os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC), "/")
        opened: list[int] = []
        try:
            for path in paths:
                with contextlib.suppress(OSError):
                    fd = self._resolver.lookup(host, path)
                    if os.path.isdir(f"/proc/self/fd/{fd}"):
                        opened.append(fd)
                    else:
                        os.close(fd)
        finally:
            host.close()
        return opened

    def _mount(self, dirs: list[int]) -> int:
        context = self._call(SYS_FSOPEN, b"overlay", FSOPEN_CLOEXEC)
        try:
            for fd in dirs:
                self._call(SYS_FSCONFIG, context, FSCONFIG_SET_FD, b"lowerdir+", None, fd)
            self._call(SYS_FSCONFIG, context, FSCONFIG_CMD_CREATE, None, None, 0)
            attrs = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC
            return self._call(SYS_FSMOUNT, context, FSMOUNT_CLOEXEC, attrs)
        finally:
            os.close(context)

    def _call(self, number: int, *args: object) -> int:
        result = self._libc.syscall(number, *args)
        if result < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        return int(result)
