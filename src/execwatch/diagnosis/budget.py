"""A time budget for work that touches tenant file systems, and memory of the slow ones.

A read on a FUSE file system that never answers, or on a hung NFS mount, blocks its
thread in the kernel and cannot be interrupted from Python. So each call runs on a
helper thread and the caller waits at most the budget: a helper that overruns is
abandoned (it ends when the kernel lets it go) and a fresh one takes the next call.
The mount the overrunning call was in is remembered, and later diagnoses refuse to
open files there instead of waiting for it again.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


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


class SlowFileSystem(Exception):
    """Raised instead of opening a file on a mount where a diagnosis already overran."""


class Overrun(Exception):
    def __init__(self, message: str, mount: Mount | None) -> None:
        super().__init__(message)
        self.mount = mount


@dataclass(eq=False)
class Attempt:
    """Where the current call is: set by SlowMounts.enter on the helper thread."""

    mount: Mount | None = None
    since: float = 0.0  # when it entered that mount (monotonic)
    tid: int = 0  # the helper thread's, to see whether the kernel holds it


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
        self._lock = threading.Lock()
        self._local = threading.local()

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
        attempt: Attempt | None = getattr(self._local, "attempt", None)
        with self._lock:
            if attempt is not None:
                attempt.mount, attempt.since = mount, now
            problem = self._problem(mount, attempt, now)
        if problem:
            raise SlowFileSystem(f"{mount} is slow: {problem}")

    def _problem(self, mount: Mount, attempt: Attempt | None, now: float) -> str | None:
        for key in (mount.mount_id, mount.device):
            marked = self._slow.get(key) if key else None
            if marked is not None and now - marked[1] < self._forget_after:
                return "an earlier diagnosis there overran its budget"
        for other in self._inflight:
            if other is attempt or other.mount is None or not _same(other.mount, mount):
                continue
            waited = now - other.since
            if waited > self._suspect_after and self._held_by_kernel(other.tid):
                return f"another diagnosis there has been waiting for {waited:.1f} s"
        return None

    def _held_by_kernel(self, tid: int) -> bool:
        """Blocked in the kernel on something other than a futex: a FUSE or NFS request
        waits there; a thread parsing a file, or waiting for the GIL (a futex), does not,
        so a slow parse never makes its mount look slow."""
        try:
            wchan = (self._proc_self / "task" / str(tid) / "wchan").read_text().strip()
        except OSError:
            return False
        return wchan not in ("", "0") and "futex" not in wchan

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
        if mount_id is None:
            return None
        try:
            mountinfo = (self._proc_self / "mountinfo").read_text(errors="surrogateescape")
        except OSError:
            return Mount(mount_id)
        for line in mountinfo.splitlines():
            fields = line.split(" ", 5)
            if len(fields) > 4 and fields[0] == str(mount_id):
                return Mount(mount_id, fields[2], fields[4].replace("\\040", " "))
        return Mount(mount_id)  # another mount namespace's: its id is still unique


def _same(a: Mount, b: Mount) -> bool:
    return a.mount_id == b.mount_id or bool(a.device and a.device == b.device)


@dataclass
class _Job(Generic[T]):
    fn: Callable[[], T]
    attempt: Attempt = field(default_factory=Attempt)
    done: threading.Event = field(default_factory=threading.Event)
    result: T | None = None
    error: BaseException | None = None
    abandoned: bool = False


class Budget:
    """Runs calls on helper threads and waits for each at most `seconds`.

    At most `max_stuck` abandoned helpers may still be blocked: past that, calls fail at
    once instead of piling up threads on a file system that never answers."""

    def __init__(self, seconds: float, slow: SlowMounts, *, max_stuck: int = 8) -> None:
        self.seconds = seconds
        self._slow = slow
        self._max_stuck = max_stuck
        self._lock = threading.Lock()
        self._idle: list[queue.SimpleQueue[_Job[object] | None]] = []
        self._stuck = 0
        self._helpers: list[queue.SimpleQueue[_Job[object] | None]] = []

    @property
    def stuck(self) -> int:
        with self._lock:
            return self._stuck

    def call(self, fn: Callable[[], T]) -> T:
        job: _Job[T] = _Job(fn)
        inbox = self._helper()
        inbox.put(job)  # type: ignore[arg-type]
        if not job.done.wait(self.seconds):
            with self._lock:
                if not job.done.is_set():
                    job.abandoned = True
                    self._stuck += 1
            if job.abandoned:
                where = f" in {job.attempt.mount}" if job.attempt.mount else ""
                raise Overrun(f"overran its {self.seconds:g} s budget{where}", job.attempt.mount)
        if job.error is not None:
            raise job.error
        return job.result  # type: ignore[return-value]

    def close(self) -> None:
        """Ends idle helpers; abandoned ones end on their own when the kernel lets them go."""
        with self._lock:
            helpers, self._helpers, self._idle = self._helpers, [], []
        for inbox in helpers:
            inbox.put(None)

    def _helper(self) -> queue.SimpleQueue[_Job[object] | None]:
        with self._lock:
            if self._idle:
                return self._idle.pop()
            if self._stuck >= self._max_stuck:
                raise Overrun(f"{self._stuck} earlier calls are still blocked", None)
            inbox: queue.SimpleQueue[_Job[object] | None] = queue.SimpleQueue()
            self._helpers.append(inbox)
        threading.Thread(target=self._serve, args=(inbox,), name="budgeted", daemon=True).start()
        return inbox

    def _serve(self, inbox: queue.SimpleQueue[_Job[object] | None]) -> None:
        while (job := inbox.get()) is not None:
            self._slow.attach(job.attempt)
            try:
                job.result = job.fn()
            except BaseException as exc:  # handed to the caller, who decides
                job.error = exc
            finally:
                self._slow.attach(None)
            with self._lock:
                job.done.set()
                if job.abandoned:
                    self._stuck -= 1
                if inbox in self._helpers:
                    self._idle.append(inbox)
                else:
                    return
