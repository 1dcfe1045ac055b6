"""Ring-buffer records by kind: each kind's decoder into its typed event, its repeat key
and its diagnosis.

Every record starts with its kind (enum ew_kind in bpf/execwatch.h, record.Kind); KINDS
maps it to the record's layout, decoder, repeat key and diagnosis. A new kind of record is
one event type (record.py) and one entry there (with its Diagnoses method).
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Generic, Protocol, TypeVar

from execwatch.probe import layout
from execwatch.record import (
    Diagnosis,
    EarlyDeath,
    Emulated,
    EnoexecExit,
    ExecFailed,
    KernelEvent,
    Kind,
    RepeatKey,
)
from execwatch.text import c_string

# A process dying this soon after its exec is an early death, and a caller exiting this
# soon after an ENOEXEC gave up on the file: the probe's default (ProbeOptions).
DEATH_WINDOW_S = 2.0
AT_EMPTY_PATH = 0x1000


class UnknownRecord(ValueError):
    """A record whose kind no entry of KINDS knows: the object and execwatch disagree."""


def boot_to_epoch_offset() -> float:
    """Seconds to add to CLOCK_BOOTTIME to get wall-clock time (the probe uses boot time)."""
    return time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)


def _head(r: Any, epoch_offset: float) -> dict[str, Any]:
    """The KernelEvent fields of struct ew_head, which every record kind starts with."""
    return {
        "time": epoch_offset + r.ktime_ns / 1e9,
        "pid": r.pid,
        "tgid": r.tgid,
        "ppid": r.ppid,
        "uid": r.uid,
        "comm": c_string(r.comm),
        "parent_comm": c_string(r.parent_comm),
        "cgroup_id": r.cgroup_id,
        "mntns": r.mntns,
        "root_ino": r.root_ino,
        "cgroup_parent_id": r.cgroup_parent_id,
        "cgroup_name": c_string(r.cgroup_name),
    }


def decode_exec_failed(raw: bytes, epoch_offset: float) -> ExecFailed:
    r = layout.EXEC_FAILED.unpack(raw)
    path = c_string(r.filename)
    via_fd = not path and bool(r.flags & AT_EMPTY_PATH)
    if via_fd:
        path = c_string(r.fd_name)  # fexecve: only the basename behind the fd is known
    return ExecFailed(
        **_head(r, epoch_offset),
        errno=r.err,
        path=path,
        syscall=layout.SYSCALLS[r.syscall] if r.syscall < len(layout.SYSCALLS) else str(r.syscall),
        dirfd=r.dirfd,
        flags=r.flags,
        via_fd=via_fd,
        root_dev=user_dev(r.root_dev),
        root_mnt_id=r.root_mnt_id,
        root_path=_root_path(r.path_flags, r.root_path),
        root_fs_path=leaf_first(r.root_path) if r.path_flags & layout.ROOT_IN_FS else None,
        base_dev=user_dev(r.base_dev),
        base_ino=r.base_ino,
        base_mnt_id=r.base_mnt_id,
        base_path=leaf_first(r.base_path) if r.path_flags & layout.BASE_IN_ROOT else None,
    )


def _root_path(flags: int, raw: bytes) -> str | None:
    """The root's path in its mount namespace: "/" when the kernel says the root is the
    namespace's own (and root_path holds its place in its filesystem instead)."""
    if flags & layout.ROOT_IN_FS:
        return "/"
    return leaf_first(raw) if flags & layout.ROOT_PATH_OK else None


def decode_early_death(raw: bytes, epoch_offset: float) -> EarlyDeath:
    r = layout.EARLY_DEATH.unpack(raw)
    signal_death = r.cause == layout.DEATH_SIGNAL
    path = leaf_first(r.exe_path)
    return EarlyDeath(
        **_head(r, epoch_offset),
        path=path if r.exe_flags & layout.EXE_PATH_OK else "…" + path,
        syscall="signal" if signal_death else "exit_group",
        exit_code=None if signal_death else r.exit_code,
        signal=r.signal if signal_death else None,
        age_ms=r.age_ns / 1e6,
        exe_ino=r.exe_ino,
        exe_dev=user_dev(r.exe_dev),
    )


def decode_emulated(raw: bytes, epoch_offset: float) -> Emulated:
    r = layout.EMULATED.unpack(raw)
    return Emulated(
        **_head(r, epoch_offset),
        path=c_string(r.filename),
        emulator=c_string(r.interp),
        emulated_arch=c_string(r.arch),
    )


def decode_enoexec_exit(raw: bytes, epoch_offset: float) -> EnoexecExit:
    r = layout.ENOEXEC_EXIT.unpack(raw)
    by_signal = r.signal != 0
    return EnoexecExit(
        **_head(r, epoch_offset),
        syscall="signal" if by_signal else "exit_group",
        exit_code=None if by_signal else r.exit_code,
        signal=r.signal if by_signal else None,
        age_ms=(r.ktime_ns - r.failed_ns) / 1e6,
        failed_time=epoch_offset + r.failed_ns / 1e9,
        execed=bool(r.execed),
    )


def leaf_first(raw: bytes) -> str:
    """The BPF program's "c/b/a/" (names from the dentry chain, leaf first) as "/a/b/c"."""
    names = c_string(raw).split("/")
    return "/" + "/".join(reversed([n for n in names if n]))


def user_dev(kernel_dev: int) -> int:
    """A kernel dev_t (major << 20 | minor) as st_dev encodes it."""
    return os.makedev(kernel_dev >> 20, kernel_dev & 0xFFFFF)


_EXEC_FAILED_KEY = layout.EXEC_FAILED.picker(
    "cgroup_id", "mntns", "root_ino", "comm", "err", "filename", "fd_name"
)
_EARLY_DEATH_KEY = layout.EARLY_DEATH.picker(
    "cgroup_id", "mntns", "root_ino", "exe_ino", "exe_dev", "exit_code", "signal"
)
_EMULATED_KEY = layout.EMULATED.picker("cgroup_id", "mntns", "root_ino", "filename")
_ENOEXEC_EXIT_KEY = layout.ENOEXEC_EXIT.picker(
    "cgroup_id", "mntns", "root_ino", "tgid", "failed_ns"
)
_new_key = tuple.__new__  # RepeatKey._make without its method call: the hot path
_EXEC_FAILED = Kind.EXEC_FAILED.value
_EARLY_DEATH = Kind.EARLY_DEATH.value
_EMULATED = Kind.EMULATED.value
_ENOEXEC_EXIT = Kind.ENOEXEC_EXIT.value


def exec_failed_key(raw: bytes) -> RepeatKey:
    """Its errno, filename and fd name; for ENOEXEC also the caller's comm: a file with
    no #! is fatal or benign by what its caller does next (pipeline.fates), so a shell's
    failure is not a repeat of a runtime's. Strings are cut at their NUL: the ring buffer
    does not zero what follows it."""
    cgroup, mntns, root, comm, err, filename, fd_name = _EXEC_FAILED_KEY.unpack_from(raw)
    name, detail = filename.split(b"\0", 1)[0], fd_name.split(b"\0", 1)[0]
    if err == errno.ENOEXEC:
        detail += b"\0" + comm.split(b"\0", 1)[0]
    return _new_key(RepeatKey, (cgroup, mntns, root, _EXEC_FAILED, err, name, detail, 0, 0))


def early_death_key(raw: bytes) -> RepeatKey:
    """Its wait status (the signal, or the exit code << 8) and the executable's inode."""
    cgroup, mntns, root, ino, dev, code, sig = _EARLY_DEATH_KEY.unpack_from(raw)
    status = sig if sig else (code & 0xFF) << 8
    return _new_key(RepeatKey, (cgroup, mntns, root, _EARLY_DEATH, status, b"", b"", dev, ino))


def emulated_key(raw: bytes) -> RepeatKey:
    """Its filename: the kernel folds its repeats by the same (Probe.take_folds)."""
    cgroup, mntns, root, filename = _EMULATED_KEY.unpack_from(raw)
    name = filename.split(b"\0", 1)[0]
    return _new_key(RepeatKey, (cgroup, mntns, root, _EMULATED, 0, name, b"", 0, 0))


def enoexec_exit_key(raw: bytes) -> RepeatKey:
    """Its task and failed exec: each is one of a kind (the pipeline never folds these)."""
    cgroup, mntns, root, tgid, failed_ns = _ENOEXEC_EXIT_KEY.unpack_from(raw)
    return _new_key(RepeatKey, (cgroup, mntns, root, _ENOEXEC_EXIT, tgid, b"", b"", 0, failed_ns))


class Diagnoses(Protocol):
    """The diagnosis of each kind that is diagnosed (diagnosis.diagnoser.FileDiagnoser)."""

    def exec_failed(self, event: ExecFailed) -> Diagnosis: ...
    def early_death(self, event: EarlyDeath) -> Diagnosis: ...
    def emulated_exec(self, event: Emulated) -> Diagnosis: ...


E = TypeVar("E", bound=KernelEvent)


@dataclass(frozen=True)
class RecordKind(Generic[E]):
    """One kind of ring-buffer record: its layout, decoder, repeat key and diagnosis."""

    event: type[E]
    layout: layout.Record
    decode: Callable[[bytes, float], E]
    repeat_key: Callable[[bytes], RepeatKey]
    # Its diagnosis by a Diagnoses; None: not diagnosed, the pipeline's own (an enoexec
    # exit decides a held failure's fate: pipeline.fates).
    diagnose: Callable[[Diagnoses, E], Diagnosis] | None
    # Whether its diagnosis reads the caller's files (FileDiagnoser.prepare opens its root).
    reads_files: bool = True


def _diagnose_exec_failed(by: Diagnoses, event: ExecFailed) -> Diagnosis:
    return by.exec_failed(event)


def _diagnose_early_death(by: Diagnoses, event: EarlyDeath) -> Diagnosis:
    return by.early_death(event)


def _diagnose_emulated(by: Diagnoses, event: Emulated) -> Diagnosis:
    return by.emulated_exec(event)


_EXEC_FAILED_KIND = RecordKind(
    ExecFailed, layout.EXEC_FAILED, decode_exec_failed, exec_failed_key, _diagnose_exec_failed
)
_EARLY_DEATH_KIND = RecordKind(
    EarlyDeath, layout.EARLY_DEATH, decode_early_death, early_death_key, _diagnose_early_death
)
_EMULATED_KIND = RecordKind(
    Emulated, layout.EMULATED, decode_emulated, emulated_key, _diagnose_emulated, reads_files=False
)
_ENOEXEC_EXIT_KIND = RecordKind(
    EnoexecExit, layout.ENOEXEC_EXIT, decode_enoexec_exit, enoexec_exit_key, None, reads_files=False
)
KINDS: Mapping[int, RecordKind[Any]] = MappingProxyType(
    {
        k.layout.kind: k
        for k in (_EXEC_FAILED_KIND, _EARLY_DEATH_KIND, _EMULATED_KIND, _ENOEXEC_EXIT_KIND)
    }
)


def diagnose(by: Diagnoses, event: KernelEvent) -> Diagnosis:
    """The event's diagnosis, by its kind's KINDS entry; ValueError for a kind never
    diagnosed."""
    entry = KINDS[event.kind]
    if entry.diagnose is None:
        raise ValueError(f"{event.kind.name} records are not diagnosed")
    return entry.diagnose(by, event)


def reads_files(event: KernelEvent) -> bool:
    """Whether the event's diagnosis reads the caller's files."""
    return KINDS[event.kind].reads_files


def kind_of(raw: bytes) -> RecordKind[Any]:
    kind = layout.KIND.unpack_from(raw)[0] if len(raw) >= layout.KIND.size else None
    found = KINDS.get(kind) if kind is not None else None
    if found is None or len(raw) < found.layout.size:
        raise UnknownRecord(
            f"ring-buffer record of unknown kind {kind} ({len(raw)} bytes): the BPF object "
            "and execwatch disagree, rebuild it"
        )
    return found


def decode_record(raw: bytes, epoch_offset: float) -> KernelEvent:
    """Any ring buffer's record, by its kind."""
    event: KernelEvent = kind_of(raw).decode(raw, epoch_offset)
    return event


def repeat_key(raw: bytes) -> RepeatKey:
    """What makes records repeats of one another, straight from the raw bytes."""
    return kind_of(raw).repeat_key(raw)
