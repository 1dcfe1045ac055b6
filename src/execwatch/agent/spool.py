"""The agent's durable spool: records waiting for the API server, on the node's disk.

One SQLite database per agent process (`spool-<owner>.db` in the spool directory, a
hostPath under /var/lib/execwatch), in WAL mode: a SIGKILL or OOM kill loses no committed
write, and SQLite's own WAL checksums discard a torn last transaction. Each row also
carries a SHA-256 over its fields, checked on replay, so a row damaged on disk (or edited
by hand) is detected, dropped and counted instead of being sent.

Ownership: the owner holds an exclusive `flock` on `spool-<owner>.lock` for as long as it
runs. Two agents on one node (a DaemonSet surge, `maxSurge: 1`) therefore never share a
file: each writes its own, and a file whose lock is free belongs to an agent that is gone;
the next agent to look *adopts* it (moves its rows into its own file, then deletes it).
The owner name is the pod name, so a container restarted in the same pod reopens its own
file.

Both agents of a surge run the probe, so both see every failure. Only the one holding
the node's `active.lock` publishes them; the other stands by, buffering, until the lock is
free. The active one, when it stops, writes the CLOCK_BOOTTIME up to which it consumed
the probe's events (`handover`) before it lets the lock go, and the next one publishes
only what it saw after that: a node is never unwatched, and a failure is not published
by both. Records are idempotent by their fixed names, so a replay never makes a second one
(a create that did reach the server answers 409).

`Handover` runs that protocol for the publisher. All I/O happens on the publisher's worker
thread, never on the probe's hot path.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from execwatch.agent.metrics import PublisherMetrics
    from execwatch.record import ExecFailure

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    name TEXT PRIMARY KEY,
    key TEXT NOT NULL,
    body TEXT NOT NULL,
    count INTEGER NOT NULL,
    first_seen REAL NOT NULL,
    last_seen REAL NOT NULL,
    sealed INTEGER NOT NULL,
    checksum TEXT NOT NULL
)
"""
_COLUMNS = "name, key, body, count, first_seen, last_seen, sealed, checksum"
_OWNER = re.compile(r"[^A-Za-z0-9_.-]")
MAX_COUNT = 1_000_000_000


class SpoolError(Exception):
    """The spool directory cannot be used (permissions, read-only, not a directory)."""


@dataclass(frozen=True)
class StoredRecord:
    """One record as it sits on disk. `sealed`: a create may have reached the server, so
    the record must only ever be re-sent as it is."""

    name: str
    key: str  # the publisher's record_key, JSON
    body: str  # the ExecFailure object, JSON
    count: int
    first_seen: float
    last_seen: float
    sealed: bool

    def checksum(self) -> str:
        h = hashlib.sha256()
        for part in (
            self.name,
            self.key,
            self.body,
            str(self.count),
            repr(self.first_seen),
            repr(self.last_seen),
            str(int(self.sealed)),
        ):
            h.update(part.encode("utf-8", "surrogatepass"))
            h.update(b"\0")
        return h.hexdigest()

    def row(self) -> tuple[Any, ...]:
        return (
            self.name,
            self.key,
            self.body,
            self.count,
            self.first_seen,
            self.last_seen,
            int(self.sealed),
            self.checksum(),
        )


@dataclass
class Loaded:
    """What a replay or an adoption found: intact records, and failures found damaged
    (`corrupt`: at least one per damaged row or unreadable file; its count when the row
    still says a plausible one)."""

    records: list[StoredRecord] = field(default_factory=list)
    corrupt: int = 0
    files: int = 0  # spool files adopted


def _verify(row: tuple[Any, ...]) -> StoredRecord | None:
    try:
        name, key, body, count, first, last, sealed, checksum = row
        record = StoredRecord(
            str(name), str(key), str(body), int(count), float(first), float(last), bool(sealed)
        )
    except (TypeError, ValueError):
        return None
    if record.checksum() != checksum or not 1 <= record.count <= MAX_COUNT:
        return None
    try:
        json.loads(record.body), json.loads(record.key)
    except ValueError:
        return None
    return record


def _claimed_count(row: tuple[Any, ...]) -> int:
    """How many failures a damaged row stood for, as far as it still tells (at least 1)."""
    try:
        count = int(row[3])
    except (TypeError, ValueError, IndexError):
        return 1
    return count if 1 <= count <= MAX_COUNT else 1


def _connect(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(str(path), timeout=5.0, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    # NORMAL in WAL mode: durable against process death (SIGKILL, OOM), which is what an
    # agent meets; a power cut may lose the last commits, never consistency.
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute("PRAGMA journal_size_limit=4194304")
    db.execute(_SCHEMA)
    return db


def _read(db: sqlite3.Connection) -> Loaded:
    """Every row, verified; a file that cannot be read to the end counts as one more
    corrupt entry (what it still held is unknown)."""
    out = Loaded()
    try:
        for row in db.execute(f"SELECT {_COLUMNS} FROM records"):
            record = _verify(row)
            if record is None:
                out.corrupt += _claimed_count(row)
                log.error("spool entry damaged, dropped", extra={"kv": {"name": str(row[0])}})
            else:
                out.records.append(record)
    except sqlite3.DatabaseError as exc:
        out.corrupt += 1
        log.error("spool file unreadable", extra={"kv": {"error": str(exc)}})
    return out


def _remove_db(path: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"{path}{suffix}")


class _FileLock:
    """An exclusive flock on a lock file that still is the file at its path."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = -1

    def acquire(self, blocking: bool) -> bool:
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
            except BlockingIOError:
                os.close(fd)
                return False
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:  # not unlinked by an adopter between our open and our lock
                self.fd = fd
                return True
            os.close(fd)

    def release(self, unlink: bool = False) -> None:
        if self.fd < 0:
            return
        if unlink:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
        os.close(self.fd)
        self.fd = -1


class Spool:
    """One agent's spool file, held under its lock; see the module docstring."""

    def __init__(self, directory: Path, owner: str) -> None:
        self.directory = directory
        self.owner = _OWNER.sub("_", owner)[:100] or "agent"
        self._lost_on_open = 0
        try:
            directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._lock = _FileLock(directory / f"spool-{self.owner}.lock")
            if not self._lock.acquire(blocking=False):
                # Another live process uses this name: never share its file.
                self.owner = f"{self.owner}-{os.urandom(4).hex()}"
                self._lock = _FileLock(directory / f"spool-{self.owner}.lock")
                self._lock.acquire(blocking=True)
            self.path = directory / f"spool-{self.owner}.db"
            self._db = self._open_own()
            self._active = _FileLock(directory / "active.lock")
        except (OSError, sqlite3.Error) as exc:
            raise SpoolError(f"spool {directory}: {exc}") from None

    def _open_own(self) -> sqlite3.Connection:
        try:
            db = _connect(self.path)
            db.execute("SELECT count(*) FROM records").fetchone()
            return db
        except sqlite3.DatabaseError as exc:
            # Not a database any more (overwritten, truncated): keep nothing of it.
            log.error("spool file unreadable, starting afresh", extra={"kv": {"error": str(exc)}})
            _remove_db(self.path)
            self._lost_on_open = 1
            return _connect(self.path)

    def load(self) -> Loaded:
        """Replay: this owner's records (a restart), then any orphaned file's."""
        own = _read(self._db)
        own.corrupt += self._lost_on_open
        self._lost_on_open = 0
        if own.corrupt:
            self._rebuild(own.records)
        adopted = self.adopt()
        own.records += adopted.records
        own.corrupt += adopted.corrupt
        own.files = adopted.files
        return own

    def _rebuild(self, intact: list[StoredRecord]) -> None:
        """A file with damage is rewritten with only its intact rows: nothing damaged is
        read twice, and SQLite never trips over the bad page again."""
        self._db.close()
        _remove_db(self.path)
        self._db = _connect(self.path)
        self.write(intact, [])

    def adopt(self) -> Loaded:
        """Move the records of spool files whose owner is gone into this one."""
        out = Loaded()
        for lock_path in sorted(self.directory.glob("spool-*.lock")):
            if lock_path.name == self._lock.path.name:
                continue
            lock = _FileLock(lock_path)
            if not lock.acquire(blocking=False):
                continue  # its owner is alive
            try:
                found = self._take(lock_path.with_suffix(".db"))
            finally:
                lock.release(unlink=True)
            out.records += found.records
            out.corrupt += found.corrupt
            out.files += 1
        return out

    def _take(self, path: Path) -> Loaded:
        if not path.exists():
            return Loaded()
        try:
            other = _connect(path)
        except sqlite3.DatabaseError as exc:
            log.error("orphaned spool file unreadable", extra={"kv": {"error": str(exc)}})
            _remove_db(path)
            return Loaded(corrupt=1)
        try:
            found = _read(other)
        finally:
            other.close()
        self.write(found.records, [])
        _remove_db(path)
        log.info(
            "adopted spool file",
            extra={"kv": {"file": path.name, "records": len(found.records)}},
        )
        return found

    def write(self, upserts: list[StoredRecord], deletes: list[str]) -> None:
        """One transaction: insert or replace `upserts`, remove `deletes`."""
        if not upserts and not deletes:
            return
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            db.executemany(
                f"INSERT OR REPLACE INTO records ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [r.row() for r in upserts],
            )
            db.executemany("DELETE FROM records WHERE name = ?", [(n,) for n in deletes])
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def try_activate(self) -> bool:
        """Take the node's active lock (no wait): True if this agent publishes what its
        probe sees, False while another agent on the node does."""
        return self._active.fd >= 0 or self._active.acquire(blocking=False)

    def take_handover(self) -> float | None:
        """The CLOCK_BOOTTIME up to which the previous active agent consumed the probe's
        events, once (the file is removed); None if it left none (it was killed) or the
        stamp is from before this boot."""
        path = self.directory / "handover"
        try:
            stamp = float(path.read_text())
            path.unlink()
        except (OSError, ValueError):
            return None
        return stamp if stamp <= time.clock_gettime(time.CLOCK_BOOTTIME) else None

    def hand_over(self, boottime: float) -> None:
        """Tell the next active agent that every event up to `boottime` is this one's."""
        if self._active.fd < 0:
            return
        tmp = self.directory / f"handover.{self.owner}"
        tmp.write_text(repr(boottime))
        os.replace(tmp, self.directory / "handover")

    def close(self) -> None:
        """Checkpoint, close and release the locks (the file stays for the next owner)."""
        with contextlib.suppress(sqlite3.Error):
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        self._db.close()
        self._active.release()
        self._lock.release()


class Handover:
    """Which agent of the node publishes, and the hand-over between two of them (see the
    module docstring). Without a spool this agent is alone: it publishes at once.

    While another agent holds the node's active lock this one stands by, buffering up to
    `capacity` failures (beyond: dropped, counted `standby_full`). Once it holds the lock it
    publishes the buffer and everything after, except what the agent before had consumed:
    failures up to its hand-over stamp count as `handed_over`, never published twice."""

    def __init__(
        self,
        spool: Spool | None,
        publish: Callable[[ExecFailure], None],
        metrics: PublisherMetrics,
        capacity: int,
    ) -> None:
        self._spool = spool
        self._publish = publish
        self._metrics = metrics
        self._capacity = capacity
        self._lock = threading.Lock()
        self._standby: list[ExecFailure] | None = None  # None: this agent publishes
        self._handed_over_until = 0.0  # epoch: failures up to then were the previous agent's
        self._stop = threading.Event()

    def start(self) -> None:
        """Publish now if the node's active lock is free, else stand by until it is."""
        if self._spool is None or self._spool.try_activate():
            self._metrics.active.set(1)
            return
        self._standby = []
        log.info("another agent publishes on this node: standing by")
        threading.Thread(
            target=self._await_turn, args=(self._spool,), name="execwatch-standby", daemon=True
        ).start()

    def submit(self, failure: ExecFailure) -> None:
        """Publish `failure`, hold it while standing by, or count it as the previous
        agent's."""
        with self._lock:
            if self._standby is not None:
                if len(self._standby) < self._capacity:
                    self._standby.append(failure)
                else:
                    self._metrics.dropped.labels("standby_full").inc(max(1, failure.count))
                return
        if failure.event.time and failure.event.time <= self._handed_over_until:
            # Seen by this probe, but consumed by the agent before (its folded repeats
            # may reach us only now, after the handover).
            self._metrics.handed_over.inc(max(1, failure.count))
            return
        self._publish(failure)

    def stop(self) -> None:
        """Stop standing by: what was held was the active agent's to publish."""
        self._stop.set()
        with self._lock:
            left, self._standby = self._standby, None
        if left:
            self._metrics.handed_over.inc(sum(max(1, f.count) for f in left))

    def hand_over(self, boottime: float | None) -> None:
        """Tell the next agent that every event up to `boottime` was this one's."""
        if self._spool is not None and boottime is not None:
            self._spool.hand_over(boottime)

    def _await_turn(self, spool: Spool) -> None:
        while not self._stop.wait(0.2):
            if spool.try_activate():
                self._activate(spool.take_handover())
                return

    def _activate(self, handed_over_at: float | None) -> None:
        """Publish what was seen while standing by, except what the agent before had
        consumed (kernel times up to `handed_over_at`, CLOCK_BOOTTIME)."""
        if handed_over_at is not None:
            offset = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
            self._handed_over_until = handed_over_at + offset
        with self._lock:
            seen, self._standby = self._standby or [], None
        self._metrics.active.set(1)
        for failure in seen:
            self.submit(failure)
        log.info(
            "publishing for this node",
            extra={"kv": {"buffered": len(seen), "handover": handed_over_at}},
        )
