"""Memory of slow file systems, for the diagnosis time budget (see pipeline.py).

A read on a FUSE file system that never answers, or on a hung NFS mount, blocks its
thread in the kernel and cannot be interrupted, not even by SIGKILL. The pipeline gives
up on such a call after its budget; the mount the call was in (noted here as it entered
it) is remembered, and later diagnoses refuse to open files there instead of waiting for
it again. Diagnosis runs in worker processes (see sandbox.py): the agent keeps the marks,
hands each call the mounts to refuse (Refusal), and the worker reports the mount it enters.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

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
        self._limit = limit
        self._suspect_after = suspect_after
        self._forget_after = forget_after
        self._slow: OrderedDict[int | str, tuple[Mount, float]] = OrderedDict()
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
        self._slow = OrderedDict()
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
        call has been held by the kernel longer than `suspect_after`."""
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
            if self.held_by_kernel(attempt.tid):
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
            if waited > self._suspect_after and self.held_by_kernel(other.tid):
                return f"another diagnosis there has been waiting for {waited:.1f} s"
        return None

    def held_by_kernel(self, tid: int) -> bool:
        """Blocked in the kernel on something other than a futex: a FUSE or NFS request
        waits there; a thread parsing a file, or waiting for the GIL (a futex), does not,
        so a slow parse never makes its mount look slow. A worker process's tid is its pid."""
        task = self._proc_self / "task" / str(tid)
        return _blocked(task if task.exists() else Path("/proc") / str(tid))

    def mark(self, mount: Mount) -> None:
        now = time.monotonic()
        with self._lock:
            for key in (mount.mount_id, mount.device):
                if key:
                    self._slow[key] = (mount, now)
                    self._slow.move_to_end(key)
            while len(self._slow) > self._limit:
                self._slow.popitem(last=False)
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


def blocked_in_kernel(pid: int) -> bool:
    """Whether process `pid`'s main thread waits in the kernel (see held_by_kernel)."""
    return _blocked(Path("/proc") / str(pid))


def _blocked(task: Path) -> bool:
    try:
        wchan = (task / "wchan").read_text().strip()
    except OSError:
        return False
    return wchan not in ("", "0") and "futex" not in wchan


def _same(a: Mount, b: Mount) -> bool:
    return a.mount_id == b.mount_id or bool(a.device and a.device == b.device)
