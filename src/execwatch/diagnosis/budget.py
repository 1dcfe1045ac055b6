"""Memory of slow file systems, for the diagnosis time budget (see pipeline.py).

A read on a FUSE file system that never answers, or on a hung NFS mount, blocks its
thread in the kernel and cannot be interrupted, not even by SIGKILL. The pipeline gives
up on such a call after its budget; the mount the call was in (noted here as it entered
it) is remembered, and later diagnoses refuse to open files there instead of waiting for
it again. Diagnosis runs in worker processes (see sandbox.py): the agent keeps the marks,
hands each call the mounts to refuse (Refusal), and the worker reports the mount it enters.
"""

from __future__ import annotations

import enum
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cachetools import FIFOCache

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Mount:
    """A mount as /proc/self/fdinfo and mountinfo tell it, without touching the file system."""

    mount_id: int
    device: str = ""  # major:minor, when the mount is visible in our mount namespace
    mount_point: str = ""

    def __str__(self) -> str:
        if self.device:
            return f"mount {self.mount_id} (device {self.device} at {self.mount_point})"
        return f"mount {self.mount_id}"


@dataclass(frozen=True)
class Refusal:
    """A mount a worker must not open files on, and why (sent with each call)."""

    mount: Mount
    why: str


class SlowFileSystem(Exception):
    """Raised instead of opening a file on a mount where a diagnosis already overran."""


@dataclass(eq=False)
class Attempt:
    """Where the current call is: set by SlowMounts.enter on the thread making it."""

    mount: Mount | None = None
    since: float = 0.0  # when it entered that mount (monotonic)
    tid: int = 0  # that thread's, to see whether the kernel holds it
    started: float = 0.0  # when the call began: a mount entered before is another call's


class Wait(enum.Enum):
    """What a task is doing, as procfs tells it without touching any file system."""

    RUNNING = "running"  # on a CPU or ready to, or waiting for a lock (a futex: the GIL)
    IPC = "ipc"  # asleep on a pipe, socket, poll, child or timer: a worker waiting for work
    FILES = "files"  # any other wait in the kernel: a file system's answer (FUSE, NFS)


# Where a task sleeps (wchan) while it waits for another process or for time, never for a
# file system. The fd check in _on_ipc_fd covers reads and writes on pipes and sockets
# whatever the kernel calls its wait; these cover the calls whose first argument is no fd.
IPC_WCHANS = frozenset(
    {
        "do_sys_poll",
        "do_poll",
        "do_select",
        "core_sys_select",
        "do_epoll_wait",
        "ep_poll",
        "do_wait",
        "kernel_wait4",
        "do_nanosleep",
        "hrtimer_nanosleep",
        "do_sigtimedwait",
        "sigsuspend",
        "pipe_read",
        "pipe_write",
        "anon_pipe_read",
        "anon_pipe_write",
        "unix_stream_read_generic",
        "unix_stream_data_wait",
        "sk_wait_data",
        "wait_woken",
        "inet_csk_accept",
    }
)


class SlowMounts:
    """Mounts (and devices) on which a call overran its budget, or on which another call
    has been waiting longer than `suspect_after`: calls there fail fast instead of
    queueing behind it. Marks expire after `forget_after` (the file system may recover);
    at most `limit` are kept, oldest forgotten first."""

    def __init__(
        self,
        proc_self: Path = Path("/proc/self"),
        *,
        limit: int = 256,
        suspect_after: float = 0.25,
        forget_after: float = 600.0,
    ) -> None:
        self._proc_self = proc_self
        self._suspect_after = suspect_after
        self._forget_after = forget_after
        self._slow: FIFOCache[int | str, tuple[Mount, float]] = FIFOCache(limit)
        self._inflight: set[Attempt] = set()
        self._refused: tuple[Refusal, ...] = ()  # the agent's, in a worker process
        self._report: Callable[[Mount], None] | None = None
        self._lock = threading.Lock()
        self._local = threading.local()

    def after_fork(self, report: Callable[[Mount], None]) -> None:
        """In a worker process: locks anew (another thread may have held them at fork), no
        marks of its own, and each mount entered is told to `report` (the agent)."""
        self._lock = threading.Lock()
        self._local = threading.local()
        self._inflight = set()
        self._slow = FIFOCache(self._slow.maxsize)
        self._report = report

    def adopt(self, refusals: tuple[Refusal, ...]) -> None:
        """In a worker process: the mounts the agent refuses for this call."""
        self._refused = refusals

    def track(self, attempt: Attempt) -> None:
        """An attempt made by another process (its tid is that process's pid)."""
        with self._lock:
            self._inflight.add(attempt)

    def untrack(self, attempt: Attempt) -> None:
        with self._lock:
            self._inflight.discard(attempt)

    @property
    def suspect_after(self) -> float:
        return self._suspect_after

    def refusals(self) -> tuple[Refusal, ...]:
        """What a call starting now must refuse: marked mounts, and those where another
        call has waited for the file system longer than `suspect_after`. The caller's own
        attempt is not tracked yet, so a call never counts against itself."""
        now = time.monotonic()
        with self._lock:
            marked = {
                m.mount_id: Refusal(m, "an earlier diagnosis there overran its budget")
                for m, at in self._slow.values()
                if now - at < self._forget_after
            }
            waiting = [a for a in self._inflight if a.mount is not None]
        for attempt in waiting:
            waited = now - attempt.since
            mount = attempt.mount
            if mount is None or mount.mount_id in marked or waited <= self._suspect_after:
                continue
            if self.waits_on_files(attempt.tid):
                why = f"another diagnosis there has been waiting for {waited:.1f} s"
                marked[mount.mount_id] = Refusal(mount, why)
        return tuple(marked.values())

    def attach(self, attempt: Attempt | None) -> None:
        """Report this thread's progress to `attempt` (None: the call is over)."""
        with self._lock:
            previous: Attempt | None = getattr(self._local, "attempt", None)
            if previous is not None:
                self._inflight.discard(previous)
            if attempt is not None:
                attempt.tid = threading.get_native_id()
                self._inflight.add(attempt)
        self._local.attempt = attempt

    def enter(self, fd: int) -> None:
        """Called before reading through fd: notes its mount, refuses a slow one."""
        mount = self.mount_of(fd)
        if mount is None:
            return
        now = time.monotonic()
        if self._report is not None:
            self._report(mount)
        attempt: Attempt | None = getattr(self._local, "attempt", None)
        with self._lock:
            if attempt is not None:
                attempt.mount, attempt.since = mount, now
            problem = self._problem(mount, attempt, now)
        if problem:
            raise SlowFileSystem(f"{mount} is slow: {problem}")

    def _problem(self, mount: Mount, attempt: Attempt | None, now: float) -> str | None:
        for refusal in self._refused:
            if _same(refusal.mount, mount):
                return refusal.why
        for key in (mount.mount_id, mount.device):
            marked = self._slow.get(key) if key else None
            if marked is not None and now - marked[1] < self._forget_after:
                return "an earlier diagnosis there overran its budget"
        for other in self._inflight:
            if other is attempt or other.mount is None or not _same(other.mount, mount):
                continue
            waited = now - other.since
            if waited > self._suspect_after and self.waits_on_files(other.tid):
                return f"another diagnosis there has been waiting for {waited:.1f} s"
        return None

    def held_by_kernel(self, tid: int) -> bool:
        """Waiting in the kernel, for anything but a lock: such a call cannot be hurried
        (the executor's watchdog). A worker process's tid is its pid."""
        return self._wait(tid) is not Wait.RUNNING

    def waits_on_files(self, tid: int) -> bool:
        """Waiting in the kernel for a file system (a FUSE or NFS request): what makes a
        mount suspect. A thread parsing a file, waiting for the GIL, or a worker idle on
        its pipe does not, so neither a slow parse nor an idle worker makes a mount slow."""
        return self._wait(tid) is Wait.FILES

    def _wait(self, tid: int) -> Wait:
        task = self._proc_self / "task" / str(tid)
        return kernel_wait(task if task.exists() else Path("/proc") / str(tid))

    def mark(self, mount: Mount) -> None:
        now = time.monotonic()
        with self._lock:
            for key in (mount.mount_id, mount.device):
                if key:
                    self._slow[key] = (mount, now)  # now the newest
        log.warning(
            "slow file system: not waiting for it again", extra={"kv": {"mount": str(mount)}}
        )

    def count(self) -> int:
        """How many mounts are marked slow now (expired marks included until pushed out)."""
        with self._lock:
            return len({m.mount_id for m, _ in self._slow.values()})

    def mount_of(self, fd: int) -> Mount | None:
        """fdinfo and mountinfo are kept by procfs: reading them never waits for the mount."""
        try:
            fdinfo = (self._proc_self / "fdinfo" / str(fd)).read_text()
        except OSError:
            return None
        mount_id = next(
            (
                int(v)
                for k, _, v in (ln.partition(":") for ln in fdinfo.splitlines())
                if k == "mnt_id"
            ),
            None,
        )
        return None if mount_id is None else self.mount_by_id(mount_id)

    def mount_by_id(self, mount_id: int) -> Mount:
        try:
            mountinfo = (self._proc_self / "mountinfo").read_text(errors="surrogateescape")
        except OSError:
            return Mount(mount_id)
        for line in mountinfo.splitlines():
            fields = line.split(" ", 5)
            if len(fields) > 4 and fields[0] == str(mount_id):
                return Mount(mount_id, fields[2], fields[4].replace("\\040", " "))
        return Mount(mount_id)  # another mount namespace's: its id is still unique


def process_wait(pid: int) -> Wait:
    """What process `pid`'s main thread waits for (see kernel_wait)."""
    return kernel_wait(Path("/proc") / str(pid))


def kernel_wait(task: Path) -> Wait:
    """`task` is a /proc/PID or /proc/PID/task/TID directory. wchan names where a sleeping
    task waits; syscall names the call and its first argument, an fd for read and write."""
    try:
        wchan = (task / "wchan").read_text().strip()
    except OSError:
        return Wait.RUNNING
    if wchan in ("", "0") or "futex" in wchan:
        return Wait.RUNNING
    if wchan in IPC_WCHANS or _on_ipc_fd(task):
        return Wait.IPC
    return Wait.FILES


def _on_ipc_fd(task: Path) -> bool:
    """Whether the task's system call works on a pipe, socket or anonymous inode."""
    try:
        fields = (task / "syscall").read_text().split()
        fd = int(fields[1], 16) if len(fields) > 2 else -1
    except (OSError, ValueError):
        return False
    if not 0 <= fd < 1 << 20:  # running, blocked outside a call (-1), or no fd argument
        return False
    try:
        target = os.readlink(task / "fd" / str(fd))
    except OSError:
        return False
    return target.startswith(("pipe:", "socket:", "anon_inode:"))


def _same(a: Mount, b: Mount) -> bool:
    return a.mount_id == b.mount_id or bool(a.device and a.device == b.device)
