"""What makes two failures repeats of one another, on the node: one key type for the
kernel's folds (a PATH search's repeated misses, counted in the probe) and for user space's
dedup of ring-buffer records, so a count the kernel folded lands on the record it followed.
"""

from __future__ import annotations

from typing import NamedTuple


class RepeatKey(NamedTuple):
    """Read straight from a raw record (no decoding). A failed exec: (cgroup, mount
    namespace, root inode, errno, filename, fd name). An early death: (cgroup, mount
    namespace, root inode, -signal or -256 - exit code, exe device, exe inode), never an
    errno, so a death is never a repeat of a failed exec."""

    cgroup_id: int
    mntns: int
    root_ino: int
    status: int
    name: bytes
    detail: bytes

    @classmethod
    def of_fold(cls, cgroup_id: int, mntns: int, root_ino: int, err: int, name: bytes) -> RepeatKey:
        """The key of a miss the kernel folded: an execve by name, so no fd name."""
        return cls(cgroup_id, mntns, root_ino, err, name, b"")
