"""binfmt_misc tables of other namespaces: since Linux 6.7 (commit 21ca59b365c0,
"binfmt_misc: enable sandboxed mounts") each user namespace may mount its own table and
register an interpreter there, which the node's table never shows.

`find_tables` walks /proc once: one read of `mountinfo` per mount namespace, keeping each
binfmt_misc superblock once (several mounts, or namespaces, may show one table). It runs
when the probe starts and when the kernel counted a binfmt_misc mount (the BPF program's
`binfmt_mounts`), never per exec. Each table is then read in its own namespace: its mount
point and its interpreters are opened with openat2(RESOLVE_IN_ROOT) inside
`/proc/<pid>/root`, so a tenant's symlink resolves in the tenant's root, and the table is
read only when the directory found is that binfmt_misc superblock (its st_dev). Everything
the tenant controls is bounded: processes visited, mountinfo bytes, tables kept, and the
table itself (binfmt.emulation's budget).
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from execwatch.binfmt import emulation
from execwatch.binfmt.emulation import Emulator
from execwatch.probe import layout
from execwatch.probe.nodebinfmt import interpreter_id
from execwatch.runnable.openat2 import Resolver, Root

log = logging.getLogger(__name__)

PROC = Path("/proc")
FSTYPE = "binfmt_misc"
MAX_PROCESSES = 1 << 16  # /proc entries visited per scan
MAX_MOUNTINFO_BYTES = 1 << 20  # per mount namespace
MAX_SCAN_BYTES = 64 << 20  # of mountinfo, per scan
MAX_TABLES = 64  # binfmt_misc superblocks kept (each costs a read per refresh)
_ESCAPE = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True)
class NamespaceTable:
    """A binfmt_misc table as one process of its mount namespace sees it."""

    pid: int
    mntns: int  # the inode of /proc/<pid>/ns/mnt: a reused pid is another namespace
    mountpoint: str  # inside that namespace's root
    dev: int  # the table's superblock, as st_dev

    @property
    def root(self) -> Path:
        return PROC / str(self.pid) / "root"


@dataclass(frozen=True)
class Found:
    """A foreign emulator of a namespace's table, its interpreter identified there."""

    emulator: Emulator
    file_id: layout.FileId
    table: NamespaceTable


def binfmt_mounts(mountinfo: str) -> list[tuple[int, str]]:
    """(superblock dev, mount point) of each binfmt_misc line of a mountinfo text."""
    found = []
    for line in mountinfo.splitlines():
        fields = line.split(" ")
        try:
            fstype = fields[fields.index("-", 6) + 1]
            major, minor = fields[2].split(":")
            dev = os.makedev(int(major), int(minor))
        except (ValueError, IndexError):
            continue  # not a mountinfo line
        if fstype == FSTYPE:
            found.append((dev, _ESCAPE.sub(lambda m: chr(int(m[1], 8)), fields[4])))
    return found


def find_tables(skip_devs: frozenset[int], proc: Path = PROC) -> list[NamespaceTable]:
    """One NamespaceTable per binfmt_misc superblock mounted in any mount namespace,
    except `skip_devs` (the node's table, read as such), within the scan's budget."""
    seen_ns: set[int] = set()
    tables: dict[int, NamespaceTable] = {}
    budget = MAX_SCAN_BYTES
    for pid in _pids(proc):
        mntns = _mntns(proc, pid)
        if mntns is None or mntns in seen_ns or budget <= 0:
            continue
        seen_ns.add(mntns)
        text = _mountinfo(proc, pid, min(budget, MAX_MOUNTINFO_BYTES))
        budget -= len(text)
        for dev, mountpoint in binfmt_mounts(text):
            if dev not in skip_devs and dev not in tables and len(tables) < MAX_TABLES:
                tables[dev] = NamespaceTable(pid, mntns, mountpoint, dev)
    return list(tables.values())


def _pids(proc: Path) -> list[int]:
    try:
        names = os.listdir(proc)
    except OSError:
        return []
    return sorted(int(n) for n in names if n.isdigit())[:MAX_PROCESSES]


def _mntns(proc: Path, pid: int) -> int | None:
    try:
        return os.stat(proc / str(pid) / "ns" / "mnt").st_ino
    except OSError:
        return None  # gone, or a kernel thread's


def _mountinfo(proc: Path, pid: int, limit: int) -> str:
    try:
        with open(proc / str(pid) / "mountinfo", "rb") as f:
            data = f.read(limit)
    except OSError:
        return ""
    return data.decode("utf-8", "replace")


@dataclass
class NamespaceBinfmt:
    """The binfmt_misc tables of other namespaces, found by find_tables and read each in
    its own root."""

    resolver: Resolver = field(default_factory=Resolver)
    tables: list[NamespaceTable] = field(default_factory=list)
    watched: tuple[Found, ...] = ()
    stale: bool = False  # walk /proc again at the next read: a table's process is gone,
    # or a counted mount may not show in mountinfo yet

    def scan(self, skip_devs: frozenset[int]) -> None:
        self.tables = find_tables(skip_devs)
        self.stale = False

    def read(self, node_arch: str) -> tuple[Found, ...]:
        """The foreign emulators of every table, their interpreters identified in the
        table's namespace; a table whose process is gone marks the list stale."""
        found: list[Found] = []
        for table in self.tables:
            read = self._read_one(table, node_arch)
            if read is None:
                self.stale = True
            else:
                found.extend(read)
        new = [f for f in found if f not in self.watched]
        if new:
            log.info(
                "binfmt_misc emulators of another namespace watched",
                extra={"kv": {"emulators": [_describe(f) for f in new]}},
            )
        self.watched = tuple(found)
        return self.watched

    def _read_one(self, table: NamespaceTable, node_arch: str) -> list[Found] | None:
        try:
            fd = os.open(table.root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return None
        root = Root(fd, f"root of pid {table.pid}")
        try:
            if _mntns(PROC, table.pid) != table.mntns:
                return None  # the pid was reused meanwhile
            read = self._read_table(root, table)
            if read is None or not read.enabled:
                return []
            found = []
            for emu in read.foreign(node_arch):
                file_id = interpreter_id(self.resolver, root, emu.interpreter)
                if file_id is not None:
                    found.append(Found(emu, file_id, table))
            return found
        finally:
            root.close()

    def _read_table(self, root: Root, table: NamespaceTable) -> emulation.Table | None:
        """The table at its mount point inside `root`, only if that is the superblock that
        mountinfo showed (a tenant cannot hand over a directory of its own making)."""
        try:
            fd = self.resolver.lookup(root, table.mountpoint)
        except OSError:
            return None
        try:
            if os.fstat(fd).st_dev != table.dev:
                return None
            return emulation.read_table(Path(f"/proc/self/fd/{fd}"))
        except OSError:
            return None
        finally:
            os.close(fd)


def _describe(found: Found) -> dict[str, object]:
    return {
        "pid": found.table.pid,
        "table": found.table.mountpoint,
        "entry": found.emulator.name,
        "interpreter": found.emulator.interpreter,
        "emulated_arch": found.emulator.arch,
        "flags": found.emulator.flags,
    }
