"""The layouts of bpf/execwatch.h, declared once for user space.

Each C struct is declared here once, as a ctypes Structure. Everything else derives
from it: the struct format that decodes a ring-buffer record (several times faster than
ctypes.from_buffer_copy), the narrower formats the repeat keys read, and the named views.
The probe compares every declaration with the object's BTF at each load
(probe.loader.check_layout), and tests/probe/test_layout.py compiles the C header and
compares.
"""

from __future__ import annotations

import collections
import ctypes
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from struct import Struct
from typing import Any

from execwatch.record import Kind

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
ROOT_IN_FS = 0x8
EXE_PATH_OK = 0x1
SYSCALLS = ("execve", "execveat")
STAT_RINGBUF_DROPS = 0
STAT_COUNTER_FULL = 1
STAT_DEATH_DROPS = 2
STAT_CGROUP_BUDGET = 3
STAT_NAMES = {
    STAT_RINGBUF_DROPS: "ringbuf_full",
    STAT_COUNTER_FULL: "counter_map_full",
    STAT_DEATH_DROPS: "death_ringbuf_full",
    STAT_CGROUP_BUDGET: "cgroup_budget",
}
TOTAL_EXIT = 64  # death_totals: a signal is its number, a loader exit TOTAL_EXIT + code
DEATH_TOTALS = TOTAL_EXIT + 256
DEATH_LOADER_EXIT = 0
DEATH_SIGNAL = 1
KIND_EXEC_FAILED = Kind.EXEC_FAILED.value  # enum ew_kind
KIND_EARLY_DEATH = Kind.EARLY_DEATH.value
KIND_EMULATED = Kind.EMULATED.value
KIND_ENOEXEC_EXIT = Kind.ENOEXEC_EXIT.value
ENOEXEC_TASKS = 4096  # entries of the enoexec_tasks map
ARCH_LEN = 16
EMULATORS = 256  # entries of the emulators map (binfmt.emulation.MAX_ENTRIES)


class Config(ctypes.Structure):
    _fields_ = (
        ("wakeup_interval_ns", ctypes.c_uint64),
        ("all_errnos", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
        ("death_window_ns", ctypes.c_uint64),
        ("fold_window_ns", ctypes.c_uint64),
        ("budget_interval_ns", ctypes.c_uint64),
        ("budget_burst_ns", ctypes.c_uint64),
        ("fold_key", ctypes.c_uint64 * FOLD_KEY_WORDS),
    )


class Head(ctypes.Structure):
    """Who and where: first in every ring-buffer record, its kind first."""

    _fields_ = (
        ("kind", ctypes.c_uint32),
        ("pid", ctypes.c_uint32),
        ("ktime_ns", ctypes.c_uint64),
        ("cgroup_id", ctypes.c_uint64),
        ("cgroup_parent_id", ctypes.c_uint64),
        ("mntns", ctypes.c_uint64),
        ("root_ino", ctypes.c_uint64),
        ("tgid", ctypes.c_uint32),
        ("ppid", ctypes.c_uint32),
        ("uid", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
        ("comm", ctypes.c_char * TASK_COMM_LEN),
        ("parent_comm", ctypes.c_char * TASK_COMM_LEN),
        ("cgroup_name", ctypes.c_char * CGROUP_NAME_LEN),
    )


class Event(ctypes.Structure):
    """A failed exec (EW_KIND_EXEC_FAILED)."""

    _fields_ = (
        ("head", Head),
        ("root_dev", ctypes.c_uint64),
        ("base_dev", ctypes.c_uint64),
        ("base_ino", ctypes.c_uint64),
        ("err", ctypes.c_int32),
        ("dirfd", ctypes.c_int32),
        ("flags", ctypes.c_uint32),
        ("syscall", ctypes.c_uint32),
        ("root_mnt_id", ctypes.c_uint32),
        ("base_mnt_id", ctypes.c_uint32),
        ("path_flags", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
        ("filename", ctypes.c_char * PATH_LEN),
        ("fd_name", ctypes.c_char * FD_NAME_LEN),
        ("root_path", ctypes.c_char * DPATH_LEN),
        ("base_path", ctypes.c_char * DPATH_LEN),
    )


class Death(ctypes.Structure):
    """A process that died right after a successful exec (EW_KIND_EARLY_DEATH)."""

    _fields_ = (
        ("head", Head),
        ("age_ns", ctypes.c_uint64),
        ("exe_ino", ctypes.c_uint64),
        ("exe_dev", ctypes.c_uint64),
        ("ip", ctypes.c_uint64),
        ("interp_base", ctypes.c_uint64),
        ("exit_code", ctypes.c_int32),
        ("signal", ctypes.c_int32),
        ("cause", ctypes.c_uint32),
        ("exe_flags", ctypes.c_uint32),
        ("exe_path", ctypes.c_char * DPATH_LEN),
    )


class EnoexecTask(ctypes.Structure):
    """enoexec_tasks' value: a task whose ENOEXEC record went out."""

    _fields_ = (("failed_ns", ctypes.c_uint64), ("exec_id", ctypes.c_uint64))


class EnoexecTaskExit(ctypes.Structure):
    """A task that exited within the death window of its ENOEXEC (EW_KIND_ENOEXEC_EXIT)."""

    _fields_ = (
        ("head", Head),
        ("failed_ns", ctypes.c_uint64),
        ("exit_code", ctypes.c_int32),
        ("signal", ctypes.c_int32),
        ("execed", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
    )


class EmulatedExec(ctypes.Structure):
    """A successful exec handed to a registered binfmt_misc emulator (EW_KIND_EMULATED)."""

    _fields_ = (
        ("head", Head),
        ("interp_dev", ctypes.c_uint64),
        ("interp_ino", ctypes.c_uint64),
        ("emulator", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
        ("arch", ctypes.c_char * ARCH_LEN),
        ("filename", ctypes.c_char * PATH_LEN),
        ("interp", ctypes.c_char * PATH_LEN),
    )


class FileId(ctypes.Structure):
    """The emulators map's key: an interpreter's device (kernel encoding) and inode."""

    _fields_ = (("dev", ctypes.c_uint64), ("ino", ctypes.c_uint64))


class EmulatorEntry(ctypes.Structure):
    _fields_ = (
        ("index", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
        ("arch", ctypes.c_char * ARCH_LEN),
    )


class EmulatedKey(ctypes.Structure):
    _fields_ = (
        ("cgroup_id", ctypes.c_uint64),
        ("mntns", ctypes.c_uint64),
        ("root_ino", ctypes.c_uint64),
        ("filename", ctypes.c_char * FOLD_NAME_LEN),
    )


class EmulatedSeen(ctypes.Structure):
    _fields_ = (("folded", ctypes.c_uint64), ("epoch", ctypes.c_uint32), ("pad", ctypes.c_uint32))


class CountKey(ctypes.Structure):
    _fields_ = (("cgroup_id", ctypes.c_uint64), ("err", ctypes.c_int32), ("pad", ctypes.c_uint32))


class BudgetKey(ctypes.Structure):
    """The budgets map's key: a cgroup id (a plain __u64 in C, so not in DECLARED)."""

    _fields_ = (("cgroup_id", ctypes.c_uint64),)


class Budget(ctypes.Structure):
    _fields_ = (("tat", ctypes.c_uint64), ("shed", ctypes.c_uint64))


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


# Every declaration above and the C struct it mirrors: what the load-time check compares.
DECLARED: tuple[tuple[type[ctypes.Structure], str], ...] = (
    (Config, "ew_config"),
    (Head, "ew_head"),
    (Event, "ew_event"),
    (Death, "ew_death"),
    (EmulatedExec, "ew_emulated"),
    (EnoexecTask, "ew_enoexec_task"),
    (EnoexecTaskExit, "ew_enoexec_exit"),
    (FileId, "ew_file_id"),
    (EmulatorEntry, "ew_emulator"),
    (EmulatedKey, "ew_emulated_key"),
    (EmulatedSeen, "ew_emulated_seen"),
    (CountKey, "ew_count_key"),
    (Budget, "ew_budget"),
    (FoldSlot, "ew_fold_slot"),
    (FoldSet, "ew_fold_set"),
    (FoldName, "ew_fold_name"),
    (FoldClock, "ew_fold_clock"),
)

# What the kernel folded repeats of, as RepeatKey.of_fold takes it: (cgroup id, mount
# namespace, root inode, status, name), a failed execve's (ew_fold_name: its errno); or the
# same with the record's kind after it (an emulated exec's, ew_emulated_key: status 0).
FoldedName = tuple[int, int, int, int, bytes] | tuple[int, int, int, int, bytes, int]


@dataclass(frozen=True)
class Field:
    """One scalar, string or array of a declaration, nested structs flattened."""

    path: str  # "head.cgroup_id"
    offset: int
    size: int
    code: str  # its struct format code: "Q", "i", "16s", "19Q"

    @property
    def name(self) -> str:
        return self.path.rpartition(".")[2]

    @property
    def padding(self) -> bool:
        return self.name == "pad"


def fields(ctype: type[ctypes.Structure], base: int = 0, prefix: str = "") -> Iterator[Field]:
    """The declaration's fields in offset order, nested structs flattened into dotted paths."""
    for entry in ctype._fields_:
        name, kind = entry[0], entry[1]
        offset = base + getattr(ctype, name).offset
        if issubclass(kind, ctypes.Structure):
            yield from fields(kind, offset, f"{prefix}{name}.")
        else:
            yield Field(f"{prefix}{name}", offset, ctypes.sizeof(kind), struct_code(kind))


def struct_code(kind: Any) -> str:
    """The struct module's code for a ctypes scalar, char array or scalar array."""
    if issubclass(kind, ctypes.Array):
        if kind._type_ is ctypes.c_char or issubclass(kind._type_, ctypes.Structure):
            return f"{ctypes.sizeof(kind)}s"  # a string, or structs as bytes
        return f"{kind._length_}{struct_code(kind._type_)}"
    code = {1: "b", 2: "h", 4: "i", 8: "q"}[ctypes.sizeof(kind)]
    return code if str(kind._type_).islower() else code.upper()


def struct_format(chosen: list[Field], size: int) -> str:
    """A standard-size format reading `chosen` (in offset order) and skipping the rest."""
    out, at = ["="], 0
    for f in chosen:
        if f.offset > at:
            out.append(f"{f.offset - at}x")
        out.append(f.code)
        at = f.offset + f.size
    if size > at:
        out.append(f"{size - at}x")
    return "".join(out)


@dataclass(frozen=True)
class Record:
    """A ring-buffer record's layout: its kind tag and the declaration it follows."""

    kind: int
    c_kind: str  # its name in enum ew_kind
    ctype: type[ctypes.Structure]
    fields: tuple[Field, ...] = field(init=False)
    struct: Struct = field(init=False)  # every field but the padding
    view: Callable[..., Any] = field(init=False)  # a named tuple of those fields

    def __post_init__(self) -> None:
        named = tuple(f for f in fields(self.ctype) if not f.padding)
        size = ctypes.sizeof(self.ctype)
        object.__setattr__(self, "fields", named)
        object.__setattr__(self, "struct", Struct(struct_format(list(named), size)))
        view = collections.namedtuple(self.ctype.__name__, [f.name for f in named])  # type: ignore[misc]
        object.__setattr__(self, "view", view._make)

    @property
    def size(self) -> int:
        return self.struct.size

    def unpack(self, raw: bytes) -> Any:
        """The record's fields by name (head fields by their own names)."""
        return self.view(self.struct.unpack_from(raw))

    def picker(self, *names: str) -> Struct:
        """A format that reads only these fields (in offset order) from a record."""
        chosen = [f for f in self.fields if f.name in names]
        if len(chosen) != len(names):
            raise KeyError(f"{self.ctype.__name__} has no field among {names}")
        return Struct(struct_format(chosen, self.size))

    def pack(self, **values: Any) -> bytes:
        """A record of this kind as the probe would send it; fields not given are zero."""
        unknown = set(values) - {f.name for f in self.fields}
        if unknown:
            raise KeyError(f"{self.ctype.__name__} has no field {sorted(unknown)}")
        values["kind"] = self.kind
        return self.struct.pack(
            *(values.get(f.name, b"" if f.code.endswith("s") else 0) for f in self.fields)
        )


EXEC_FAILED = Record(KIND_EXEC_FAILED, "EW_KIND_EXEC_FAILED", Event)
EARLY_DEATH = Record(KIND_EARLY_DEATH, "EW_KIND_EARLY_DEATH", Death)
EMULATED = Record(KIND_EMULATED, "EW_KIND_EMULATED", EmulatedExec)
ENOEXEC_EXIT = Record(KIND_ENOEXEC_EXIT, "EW_KIND_ENOEXEC_EXIT", EnoexecTaskExit)
RECORDS = (EXEC_FAILED, EARLY_DEATH, EMULATED, ENOEXEC_EXIT)
KIND = Struct("=I")  # every record's first field


def head_picker(*names: str) -> Struct:
    """A format that reads only these fields of the head, from a record of any kind."""
    chosen = [f for f in fields(Head) if f.name in names]
    if len(chosen) != len(names):
        raise KeyError(f"the record head has no field among {names}")
    return Struct(struct_format(chosen, ctypes.sizeof(Head)))
