"""What makes two records repeats of one another, on the node: one key type for the
kernel's folds (a PATH search's repeated misses and an emulated exec's repeats, counted in
the probe) and for user space's dedup of ring-buffer records, so a count the kernel folded
lands on the record it followed.
"""

from __future__ import annotations

from typing import NamedTuple

from execwatch.record import Kind


class RepeatKey(NamedTuple):
    """Where (cgroup, mount namespace, root inode: two chroots of one namespace stay apart),
    the record's kind, then that kind's own fields. Read straight from a raw record, no
    decoding (probe.events.KINDS), or from the probe's fold maps (Probe.take_folds). Keys
    of two kinds never match, whatever their numbers."""

    cgroup_id: int
    mntns: int
    root_ino: int
    kind: int  # a Kind's value, the record's enum ew_kind
    # A failed exec's errno. An early death's wait status, as waitpid(2) gives it: the
    # fatal signal's number, or the loader's exit code << 8. 0 for an emulated exec.
    status: int
    name: bytes = b""  # the filename of a failed or emulated exec, cut at its NUL
    detail: bytes = b""  # the name behind the fd of a failed fexecve, cut at its NUL
    exe_dev: int = 0  # an early death's executable: its device (kernel dev_t encoding)
    exe_ino: int = 0  # and inode

    @classmethod
    def of_fold(
        cls,
        cgroup_id: int,
        mntns: int,
        root_ino: int,
        status: int,
        name: bytes,
        kind: int = Kind.EXEC_FAILED.value,
    ) -> RepeatKey:
        """The key of the record whose repeats the kernel folded (probe.layout.FoldedName):
        a failed execve by name (ew_fold_name), or an emulated exec (ew_emulated_key)."""
        return cls(cgroup_id, mntns, root_ino, kind, status, name)
