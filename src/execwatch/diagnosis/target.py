"""The file a failed exec named, opened again inside the caller's root.

By path: the kernel's record made absolute (dirfd or cwd) and opened through openat2,
never leaving the root. For fexecve: the caller's fd while it lives and still holds the
file the kernel recorded, then the recorded path if it is still that very file.
"""

from __future__ import annotations

import errno
import os

from execwatch.diagnosis.roots import RootLocator
from execwatch.record import ExecFailed
from execwatch.runnable.openat2 import MountGuard, Resolver, Root, reopen_regular


class TargetOpener:
    """Opens the exec's file for reading; raises OSError (FileNotFoundError: gone)."""

    def __init__(self, locator: RootLocator, resolver: Resolver, slow: MountGuard | None) -> None:
        self._locator = locator
        self._resolver = resolver
        self._slow = slow

    def open(self, root: Root, event: ExecFailed) -> int:
        if event.via_fd:  # fexecve: the caller's fd is the file
            return self._open_fd_target(root, event)
        path = self._locator.absolute(event, event.path)
        if path is None:
            raise OSError(
                errno.ENOENT, "relative path and the working directory is gone", event.path
            )
        return self._resolver.open_regular(root, path)

    def _open_fd_target(self, root: Root, event: ExecFailed) -> int:
        """Through the caller's fd while it lives and still holds the file the kernel
        recorded (device and inode: the pid may have been reused); then by the path inside
        its root that the kernel recorded, if that is still the very same file."""
        try:
            path_fd = os.open(f"/proc/{event.tgid}/fd/{event.dirfd}", os.O_PATH)
        except OSError:
            path_fd = -1
        if path_fd >= 0 and not _same_file(path_fd, event):
            os.close(path_fd)  # another process's fd under a reused pid
            path_fd = -1
        if path_fd < 0:
            if event.base_path is None:
                raise FileNotFoundError(errno.ENOENT, "the caller's fd is gone", event.path)
            path_fd = self._resolver.lookup(root, event.base_path)
            if not _same_file(path_fd, event):
                os.close(path_fd)
                raise FileNotFoundError(errno.ENOENT, "the fd's file was replaced", event.base_path)
        return reopen_regular(path_fd, event.path, self._slow)


def _same_file(fd: int, event: ExecFailed) -> bool:
    """The fd is the file the kernel recorded for fexecve (when it recorded one)."""
    if not event.base_ino:
        return True
    st = os.fstat(fd)
    return (st.st_ino, st.st_dev) == (event.base_ino, event.base_dev)
