"""The record that flows through execwatch: kernel event -> diagnosis -> attribution -> record.

Every consumer (trace output, Prometheus metrics, the cluster publisher and handler)
reads these types, so a field added here shows up everywhere at once.
"""

from __future__ import annotations

import dataclasses
import enum
import errno as errno_mod
import signal as signal_mod
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

from execwatch.runnable.reason import Reason as Reason  # the vocabulary every record speaks

# Counted in metrics but not reported unless asked for: noise or the program's own bug.
QUIET_REASONS = frozenset(
    {Reason.NOT_FOUND, Reason.BENIGN_EXIT, Reason.STARTUP_CRASH, Reason.NO_SHEBANG}
)
# Not a platform problem: alerts and the Argo analysis leave these out (their selectors are
# tested against this set).
NOT_ALERTED = frozenset({*QUIET_REASONS, Reason.EMULATED})
# The image does not run on the node's platform: the handler's feedback to placement (an
# observed `fails` for the image digest and the node's architecture) speaks only of these.
PLATFORM_REASONS = frozenset(
    {
        Reason.FOREIGN_ARCHITECTURE,
        Reason.MISSING_INTERPRETER,
        Reason.LIBC_MISMATCH,
        Reason.UNSUPPORTED_CPU,
    }
)


# Fail on every node whatever its architecture (no `#!` line its caller retries, another
# OS's executable): never platform-class, so placement never narrows for them, and audit
# reports them on every architecture.
EVERY_ARCHITECTURE_REASONS = frozenset({Reason.MISSING_SHEBANG, Reason.FOREIGN_OS})


class UndiagnosedCause(enum.StrEnum):
    """Why a failure is reported Undiagnosed: the `cause` label of
    execwatch_undiagnosed_total, and trace's summary when it stops."""

    SLOW_MOUNT = "slow_mount"  # not read: a diagnosis there overran, or waits too long now
    OVERRAN = "overran"  # this call overran its time budget (a hung file system)
    KILLED = "killed"  # its worker was killed: CPU, memory, crash or deadline
    NO_WORKER = "no_worker"  # no diagnosis worker was alive and none could be started
    OVERLOADED = "overloaded"  # dropped before diagnosis: the pipeline was full
    GONE = "gone"  # the task, and every root that could stand for its own, are gone
    UNREADABLE = "unreadable"  # the file, or what it names, could not be read
    UNEXPLAINED = "unexplained"  # read, and no rule explains it
    STOPPING = "stopping"  # execwatch was stopping
    FAILED = "failed"  # a bug: the diagnosis raised
    EVICTED = "evicted"  # repeats counted after their record left the repeat table


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """What user space found when it looked at the file the kernel refused to run."""

    reason: Reason
    node_arch: str
    binary_arch: str | None = None
    interpreter: str | None = None
    detail: str = ""
    library: str | None = None  # the library the loader could not find or that lacks something
    symbol: str | None = None
    version: str | None = None  # a symbol version (GLIBC_2.38) or an ISA level (x86-64-v3)
    cause: UndiagnosedCause | None = None  # Undiagnosed only: why


def undiagnosed(cause: UndiagnosedCause, detail: str, node_arch: str = "") -> Diagnosis:
    return Diagnosis(Reason.UNDIAGNOSED, node_arch, detail=detail, cause=cause)


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
    # The caller's root, opened in the agent before the event goes to a diagnosis worker
    # (a dying task or container is gone within milliseconds; the open fd pins its file
    # system): the worker's fd for it, -1 when none was opened.
    root_fd: int = -1
    root_description: str = ""
    pod_uid: str | None = None
    namespace: str | None = None
    pod: str | None = None
    container: str | None = None
    image: str | None = None
    workload_kind: str | None = None
    workload: str | None = None
    # A Docker or Podman container's, from its engine (container and image above name it):
    image_id: str | None = None
    compose_project: str | None = None  # com.docker.compose.project
    compose_service: str | None = None  # com.docker.compose.service
    engine_user: str | None = None  # the user whose rootless engine runs the container
    engine_pod: str | None = None  # the Podman pod's name (`pod` is a Kubernetes pod's)


class Kind(enum.IntEnum):
    """What the kernel reported: enum ew_kind of bpf/execwatch.h, the first field of every
    ring-buffer record. Each kind has its event type (below: ExecFailed, EarlyDeath,
    Emulated, EnoexecExit), decoder, repeat key and diagnosis (probe.events.KINDS)."""

    EXEC_FAILED = 1  # an exec the kernel refused
    EARLY_DEATH = 2  # a process that died in its loader or by a fatal signal right after exec
    EMULATED = 3  # an exec a binfmt_misc emulator ran
    # A task that exited within the death window of an exec refused with ENOEXEC: never
    # diagnosed, it decides the fate of the failed exec's record (pipeline.fates).
    ENOEXEC_EXIT = 4


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


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelEvent:
    """One record of the BPF program, decoded: what every kind has (struct ew_head, and
    what the agent adds before a diagnosis worker takes it). Each kind is a subclass with
    its own fields (ExecFailed, EarlyDeath, Emulated, EnoexecExit); `kind` says which."""

    kind: ClassVar[Kind]
    time: float  # seconds since the epoch
    pid: int
    tgid: int
    ppid: int
    uid: int
    comm: str
    parent_comm: str
    cgroup_id: int
    mntns: int
    # How the task got here: "execve" or "execveat" for an exec; "exit_group" or "signal"
    # for a task that ended.
    syscall: str
    path: str = ""  # the file the record is about; "" when none
    root_ino: int = 0  # inode of the caller's root directory, to recognise a stand-in root
    cgroup_parent_id: int = 0  # the cgroup's parent, whose path outlives the cgroup
    cgroup_name: str = ""  # the cgroup directory's own name
    # The container the agent's live inventory names for cgroup_id, looked up in the agent
    # before the event goes to a diagnosis worker, whose copy of the inventory is as old as
    # the worker ("": looked up, none; None: not looked up).
    container_id: str | None = None
    # The caller's root, opened in the agent before the event goes to a diagnosis worker
    # (a dying task or container is gone within milliseconds; the open fd pins its file
    # system): the worker's fd for it, -1 when none was opened.
    root_fd: int = -1
    root_description: str = ""

    @property
    def status(self) -> str:
        """What the record says happened, in one word: the kind's name unless it has its own."""
        return self.kind.name


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecFailed(KernelEvent):
    """An exec the kernel refused. `path` is the filename argument, or the basename behind
    the fd for fexecve (`via_fd`)."""

    kind: ClassVar[Kind] = Kind.EXEC_FAILED
    errno: int
    syscall: str = "execve"
    dirfd: int = -100
    flags: int = 0
    via_fd: bool = False  # fexecve: path is only the basename behind dirfd
    # What finds the root and the file once the caller is gone (from the dentry chain):
    root_dev: int = 0  # st_dev of the caller's root directory
    root_mnt_id: int = 0
    root_path: str | None = None  # the root's path in its mount namespace, when whole
    # When the root is its mount namespace's (a container's): its path inside its own
    # filesystem (st_dev root_dev), which a mount of that filesystem elsewhere shows.
    root_fs_path: str | None = None
    base_dev: int = 0  # the base: the fd's file for fexecve, else the directory
    base_ino: int = 0  # (dirfd or cwd) a relative path resolves against
    base_mnt_id: int = 0
    base_path: str | None = None  # the base's path inside the caller's root, when whole

    @property
    def status(self) -> str:
        """The errno's name: ENOENT, ENOEXEC..."""
        return errno_mod.errorcode.get(self.errno, str(self.errno))


@dataclass(frozen=True, slots=True, kw_only=True)
class Ended(KernelEvent):
    """A task that ended: by a fatal signal (default action), or by exit_group."""

    exit_code: int | None = None  # exit_group's status; None when a signal ended it
    signal: int | None = None  # the fatal signal; None when it exited
    # Since the task started (an early death) or since the failed exec (an enoexec exit).
    age_ms: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class EarlyDeath(Ended):
    """A process that died in its loader (exit_group from inside it) or by a fatal signal
    right after exec. `path` is its executable (mm->exe_file)."""

    kind: ClassVar[Kind] = Kind.EARLY_DEATH
    syscall: str = "exit_group"
    exe_ino: int = 0  # the executable's inode and device (os.makedev form)
    exe_dev: int = 0

    @property
    def status(self) -> str:
        """SIGSEGV, or EXIT127."""
        if self.signal is not None:
            try:
                return signal_mod.Signals(self.signal).name
            except ValueError:
                return f"SIG{self.signal}"
        return f"EXIT{self.exit_code}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Emulated(KernelEvent):
    """An exec a binfmt_misc emulator ran. `path` is the file run."""

    kind: ClassVar[Kind] = Kind.EMULATED
    syscall: str = "execve"
    emulator: str | None = None  # the binfmt_misc interpreter that ran path
    emulated_arch: str | None = None  # the architecture its entry selects


@dataclass(frozen=True, slots=True, kw_only=True)
class EnoexecExit(Ended):
    """A task that exited within the death window of an exec refused with ENOEXEC: never
    diagnosed, it decides the fate of the failed exec's record (pipeline.fates)."""

    kind: ClassVar[Kind] = Kind.ENOEXEC_EXIT
    syscall: str = "exit_group"
    failed_time: float | None = None  # the time of the failed exec it follows
    execed: bool = False  # a successful exec came between


@dataclass(frozen=True, slots=True)
class ExecFailure:
    """A diagnosed, attributed failed exec: what trace prints and what the cluster publishes."""

    event: KernelEvent
    diagnosis: Diagnosis
    attribution: Attribution = field(default_factory=Attribution)
    count: int = 1  # identical failures folded into this one

    def to_json(self) -> dict[str, Any]:
        e, d = self.event, self.diagnosis
        exit_code, signal, age_ms = (
            (e.exit_code, e.signal, e.age_ms) if isinstance(e, Ended) else (None, None, None)
        )
        out: dict[str, Any] = {
            "time": e.time,
            "errno": e.status,
            "reason": str(d.reason),
            "path": e.path,
            "binary_arch": d.binary_arch,
            "node_arch": d.node_arch,
            "interpreter": d.interpreter,
            "detail": d.detail,
            "library": d.library,
            "symbol": d.symbol,
            "version": d.version,
            "cause": None if d.cause is None else str(d.cause),
            "exit_code": exit_code,
            "signal": signal,
            "age_ms": age_ms,
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
