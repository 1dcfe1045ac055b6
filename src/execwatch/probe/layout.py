"""The event and config layouts of bpf/execwatch.h, mirrored for user space.

tests/test_layout.py compiles the C header and checks these offsets against it.
"""

from __future__ import annotations

import ctypes
import struct

TASK_COMM_LEN = 16
PATH_LEN = 256
FD_NAME_LEN = TASK_COMM_LEN * 4
CGROUP_NAME_LEN = 128
DPATH_LEN = 256
FOLD_NAME_LEN = 128  # names this long or longer are never folded
FOLD_WORDS = FOLD_NAME_LEN // 8
FOLD_KEY_WORDS = FOLD_WORDS + 3
FOLD_SETS = 16  # per CPU, of FOLD_WAYS slots each
FOLD_WAYS = 4
FOLD_SLOTS = FOLD_SETS * FOLD_WAYS  # per CPU
ROOT_PATH_OK = 0x1
BASE_SET = 0x2
BASE_IN_ROOT = 0x4
SYSCALLS = ("execve", "execveat")
STAT_RINGBUF_DROPS = 0
STAT_COUNTER_FULL = 1
STAT_DEATH_DROPS = 2
STAT_NAMES = {
    STAT_RINGBUF_DROPS: "ringbuf_full",
    STAT_COUNTER_FULL: "counter_map_full",
    STAT_DEATH_DROPS: "death_ringbuf_full",
}
EXE_DEPTH = 8
EXE_NAME_LEN = 64
EXE_TRUNCATED = 0x80000000
TOTAL_EXIT = 64  # death_totals: a signal is its number, a loader exit TOTAL_EXIT + code
DEATH_TOTALS = TOTAL_EXIT + 256
DEATH_LOADER_EXIT = 0
DEATH_SIGNAL = 1


class Config(ctypes.Structure):
    _fields_ = (
        ("wakeup_interval_ns", ctypes.c_uint64),
        ("all_errnos", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
        ("death_window_ns", ctypes.c_uint64),
        ("fold_window_ns", ctypes.c_uint64),
        ("fold_key", ctypes.c_uint64 * FOLD_KEY_WORDS),
    )


class Event(ctypes.Structure):
    _fields_ = (
        ("ktime_ns", ctypes.c_uint64),
        ("cgroup_id", ctypes.c_uint64),
        ("cgroup_parent_id", ctypes.c_uint64),
        ("mntns", ctypes.c_uint64),
        ("root_ino", ctypes.c_uint64),
        ("err", ctypes.c_int32),
        ("pid", ctypes.c_uint32),
        ("tgid", ctypes.c_uint32),
        ("ppid", ctypes.c_uint32),
        ("uid", ctypes.c_uint32),
        ("dirfd", ctypes.c_int32),
        ("flags", ctypes.c_uint32),
        ("syscall", ctypes.c_uint32),
        ("comm", ctypes.c_char * TASK_COMM_LEN),
        ("parent_comm", ctypes.c_char * TASK_COMM_LEN),
        ("filename", ctypes.c_char * PATH_LEN),
        ("fd_name", ctypes.c_char * FD_NAME_LEN),
        ("cgroup_name", ctypes.c_char * CGROUP_NAME_LEN),
        ("root_dev", ctypes.c_uint64),
        ("base_dev", ctypes.c_uint64),
        ("base_ino", ctypes.c_uint64),
        ("root_mnt_id", ctypes.c_uint32),
        ("base_mnt_id", ctypes.c_uint32),
        ("path_flags", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
        ("root_path", ctypes.c_char * DPATH_LEN),
        ("base_path", ctypes.c_char * DPATH_LEN),
    )


class Death(ctypes.Structure):
    _fields_ = (
        ("ktime_ns", ctypes.c_uint64),
        ("age_ns", ctypes.c_uint64),
        ("cgroup_id", ctypes.c_uint64),
        ("cgroup_parent_id", ctypes.c_uint64),
        ("mntns", ctypes.c_uint64),
        ("root_ino", ctypes.c_uint64),
        ("exe_ino", ctypes.c_uint64),
        ("exe_dev", ctypes.c_uint64),
        ("ip", ctypes.c_uint64),
        ("interp_base", ctypes.c_uint64),
        ("exit_code", ctypes.c_int32),
        ("signal", ctypes.c_int32),
        ("pid", ctypes.c_uint32),
        ("tgid", ctypes.c_uint32),
        ("ppid", ctypes.c_uint32),
        ("uid", ctypes.c_uint32),
        ("kind", ctypes.c_uint32),
        ("exe_depth", ctypes.c_uint32),
        ("comm", ctypes.c_char * TASK_COMM_LEN),
        ("parent_comm", ctypes.c_char * TASK_COMM_LEN),
        ("exe", ctypes.c_char * (EXE_DEPTH * EXE_NAME_LEN)),
        ("cgroup_name", ctypes.c_char * CGROUP_NAME_LEN),
    )


class CountKey(ctypes.Structure):
    _fields_ = (("cgroup_id", ctypes.c_uint64), ("err", ctypes.c_int32), ("pad", ctypes.c_uint32))


class FoldSlot(ctypes.Structure):
    _fields_ = (("tag", ctypes.c_uint64), ("epoch", ctypes.c_uint32), ("folded", ctypes.c_uint32))


class FoldSet(ctypes.Structure):
    _fields_ = (("way", FoldSlot * FOLD_WAYS),)


class FoldName(ctypes.Structure):
    _fields_ = (
        ("tag", ctypes.c_uint64),
        ("cgroup_id", ctypes.c_uint64),
        ("mntns", ctypes.c_uint64),
        ("root_ino", ctypes.c_uint64),
        ("err", ctypes.c_int32),
        ("pad", ctypes.c_uint32),
        ("filename", ctypes.c_char * FOLD_NAME_LEN),
    )


class FoldClock(ctypes.Structure):
    _fields_ = (("epoch", ctypes.c_uint64), ("harvested", ctypes.c_uint64))


# (cgroup id, mount namespace, root inode, errno, name): what the kernel folds repeats of.
FoldedName = tuple[int, int, int, int, bytes]


class EventFields:
    """Byte slices of Event fields, for reading a few fields without decoding the record."""

    cgroup = slice(Event.cgroup_id.offset, Event.cgroup_id.offset + 8)
    mntns = slice(Event.mntns.offset, Event.mntns.offset + 8)
    root_ino = slice(Event.root_ino.offset, Event.root_ino.offset + 8)
    err = slice(Event.err.offset, Event.err.offset + 4)
    filename = slice(Event.filename.offset, Event.filename.offset + PATH_LEN)
    fd_name = slice(Event.fd_name.offset, Event.fd_name.offset + FD_NAME_LEN)


EVENT_FIELDS = EventFields()

# struct.Struct decodes a ring-buffer record several times faster than ctypes.from_buffer_copy.
EVENT_STRUCT = struct.Struct(
    f"=QQQQQiIIIIiII{TASK_COMM_LEN}s{TASK_COMM_LEN}s{PATH_LEN}s{FD_NAME_LEN}s{CGROUP_NAME_LEN}s"
    f"QQQIIII{DPATH_LEN}s{DPATH_LEN}s"
)

DEATH_STRUCT = struct.Struct(
    f"=QQQQQQQQQQiiIIIIII{TASK_COMM_LEN}s{TASK_COMM_LEN}s{EXE_DEPTH * EXE_NAME_LEN}s"
    f"{CGROUP_NAME_LEN}s"
)


class DeathFields:
    """Byte slices of Death fields, for the pipeline's repeat key."""

    cgroup = slice(Death.cgroup_id.offset, Death.cgroup_id.offset + 8)
    mntns = slice(Death.mntns.offset, Death.mntns.offset + 8)
    root_ino = slice(Death.root_ino.offset, Death.root_ino.offset + 8)
    exe_ino = slice(Death.exe_ino.offset, Death.exe_ino.offset + 8)
    exe_dev = slice(Death.exe_dev.offset, Death.exe_dev.offset + 8)
    exit_code = slice(Death.exit_code.offset, Death.exit_code.offset + 4)
    signal = slice(Death.signal.offset, Death.signal.offset + 4)


DEATH_FIELDS = DeathFields()
