"""The record that flows through execwatch: kernel event -> diagnosis -> attribution -> record.

Every consumer (trace output, Prometheus metrics, the cluster publisher and handler)
reads these types, so a field added here shows up everywhere at once.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any


class Reason(enum.StrEnum):
    """Why an exec failed. Values are stable: they become metric labels and Event reasons."""

    FOREIGN_ARCHITECTURE = "ForeignArchitecture"
    MISSING_INTERPRETER = "MissingInterpreter"
    BAD_INTERPRETER = "BadInterpreter"
    MISSING_SHEBANG_INTERPRETER = "MissingShebangInterpreter"
    NO_SHEBANG = "NoShebang"
    CORRUPT_BINARY = "CorruptBinary"
    PERMISSION_DENIED = "PermissionDenied"
    NOT_FOUND = "NotFound"
    UNDIAGNOSED = "Undiagnosed"


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """What user space found when it looked at the file the kernel refused to run."""

    reason: Reason
    node_arch: str
    binary_arch: str | None = None
    interpreter: str | None = None
    detail: str = ""


class AttributionStatus(enum.StrEnum):
    ATTRIBUTED = "attributed"  # pod and container known
    PARTIAL = "partial"  # container known, pod metadata missing (e.g. pod already deleted)
    HOST = "host"  # a host process or a non-Kubernetes container
    UNATTRIBUTED = "unattributed"  # cgroup not understood: raw path kept, never a guessed pod


@dataclass(frozen=True, slots=True)
class Attribution:
    """Which container and pod a cgroup belongs to."""

    status: AttributionStatus = AttributionStatus.UNATTRIBUTED
    cgroup_path: str | None = None
    runtime: str | None = None
    container_id: str | None = None
    pod_uid: str | None = None
    namespace: str | None = None
    pod: str | None = None
    container: str | None = None
    image: str | None = None
    workload_kind: str | None = None
    workload: str | None = None


@dataclass(frozen=True, slots=True)
class KernelEvent:
    """One failed exec exactly as the BPF program captured it."""

    time: float  # seconds since the epoch
    errno: int
    pid: int
    tgid: int
    ppid: int
    uid: int
    comm: str
    parent_comm: str
    path: str  # the filename argument, or the fd's name for fexecve
    cgroup_id: int
    mntns: int
    syscall: str  # "execve" or "execveat"
    dirfd: int = -100
    flags: int = 0
    via_fd: bool = False  # fexecve: path is only the basename behind dirfd
    root_ino: int = 0  # inode of the caller's root directory, to recognise a stand-in root
    cgroup_parent_id: int = 0  # the cgroup's parent, whose path outlives the cgroup
    cgroup_name: str = ""  # the cgroup directory's own name
    # What finds the root and the file once the caller is gone (from the dentry chain):
    root_dev: int = 0  # st_dev of the caller's root directory
    root_mnt_id: int = 0
    root_path: str | None = None  # the root's path in its mount namespace, when whole
    base_dev: int = 0  # the base: the fd's file for fexecve, else the directory
    base_ino: int = 0  # (dirfd or cwd) a relative path resolves against
    base_mnt_id: int = 0
    base_path: str | None = None  # the base's path inside the caller's root, when whole


@dataclass(frozen=True, slots=True)
class ExecFailure:
    """A diagnosed, attributed failed exec: what trace prints and what the cluster publishes."""

    event: KernelEvent
    diagnosis: Diagnosis
    attribution: Attribution = field(default_factory=Attribution)
    count: int = 1  # identical failures folded into this one

    def to_json(self) -> dict[str, Any]:
        import errno as errno_mod

        e, d = self.event, self.diagnosis
        out: dict[str, Any] = {
            "time": e.time,
            "errno": errno_mod.errorcode.get(e.errno, str(e.errno)),
            "reason": str(d.reason),
            "path": e.path,
            "binary_arch": d.binary_arch,
            "node_arch": d.node_arch,
            "interpreter": d.interpreter,
            "detail": d.detail,
            "pid": e.tgid,
            "tid": e.pid,
            "ppid": e.ppid,
            "comm": e.comm,
            "parent_comm": e.parent_comm,
            "uid": e.uid,
            "cgroup_id": e.cgroup_id,
            "mntns": e.mntns,
            "syscall": e.syscall,
            "count": self.count,
        }
        attribution = dataclasses.asdict(self.attribution)
        attribution["attribution"] = str(attribution.pop("status"))
        out.update(attribution)
        return out
