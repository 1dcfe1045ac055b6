"""The node's binfmt_misc table and its emulators' inodes, looked up inside the node's root.

The agent runs in a container: there `/proc/sys/fs/binfmt_misc` is an empty directory (no
binfmt_misc is mounted in the container's mount namespace) and an entry's interpreter path
is a path of the node, not of the container. So both are looked up inside `host_root`, an
absolute path to the node's root directory (`/` for `execwatch trace` on the host,
`/proc/1/root` for the DaemonSet, which shares the host's PID namespace): the table is read
at `<host_root><table>`, and each interpreter is opened (O_PATH) with
openat2(RESOLVE_IN_ROOT) in that root, so an absolute symlink of the node resolves in the
node's root, never in the agent's. fstat gives the (device, inode) pair the kernel's
`emulators` map is keyed by.

An entry whose interpreter is not found in the node's root (registered from another mount
namespace, such as a `tonistiigi/binfmt` container, or deleted since) cannot be watched: it
is logged once while it stays so, and kept in `unidentified`.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from execwatch.binfmt import emulation
from execwatch.binfmt.emulation import Emulator
from execwatch.probe import layout
from execwatch.runnable.openat2 import Resolver, Root

log = logging.getLogger(__name__)
HOST_ROOT = Path("/")


@dataclass
class NodeBinfmt:
    """Reads the table at `table` and resolves interpreters, both inside `host_root`."""

    host_root: Path = HOST_ROOT
    table: Path = emulation.TABLE  # absolute, as seen from the node's root
    resolver: Resolver = field(default_factory=Resolver)
    problems: dict[str, str] = field(default_factory=dict)  # what cannot be read, and why
    unidentified: tuple[Emulator, ...] = ()  # foreign entries not found in the node's root

    @property
    def table_path(self) -> Path:
        """Where this process reaches the node's table."""
        return self.host_root / self.table.relative_to(self.table.anchor)

    def read_table(self) -> emulation.Table | None:
        """The node's table; None when no binfmt_misc is mounted there, or when the node's
        root or its table cannot be read (a warning, once while the cause stays the same)."""
        root = self._open_root()
        if root is None:
            return None
        try:  # through the fd: the root that was opened, even if host_root changes meanwhile
            inside = self.table.relative_to(self.table.anchor)
            table = emulation.read_table(Path(f"/proc/self/fd/{root.fd}") / inside)
        except OSError as exc:
            self._report("table", f"cannot read {self.table_path}: {exc.strerror or exc}")
            return None
        finally:
            root.close()
        self._report("table", "")
        return table

    def identify(self, emulators: tuple[Emulator, ...]) -> list[tuple[Emulator, layout.FileId]]:
        """Each emulator whose interpreter is found in the node's root, with its inode."""
        root = self._open_root() if emulators else None
        found: list[tuple[Emulator, layout.FileId]] = []
        missing: list[Emulator] = []
        try:
            for emu in emulators:
                file_id = interpreter_id(self.resolver, root, emu.interpreter) if root else None
                if file_id is None:
                    missing.append(emu)
                else:
                    found.append((emu, file_id))
        finally:
            if root is not None:
                root.close()
        self._note_unidentified(tuple(missing))
        return found

    def _open_root(self) -> Root | None:
        try:
            fd = os.open(self.host_root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            self._report("root", f"cannot open the node's root {self.host_root}: {exc.strerror}")
            return None
        self._report("root", "")
        return Root(fd, f"node root {self.host_root}")

    def _note_unidentified(self, missing: tuple[Emulator, ...]) -> None:
        for emu in missing:
            if emu not in self.unidentified:
                log.warning(
                    "binfmt_misc emulator not watched: its interpreter is not in the node's"
                    " root, so its execs are not reported Emulated",
                    extra={
                        "kv": {
                            "entry": emu.name,
                            "interpreter": emu.interpreter,
                            "emulated_arch": emu.arch,
                            "flags": emu.flags,
                            "host_root": str(self.host_root),
                        }
                    },
                )
        self.unidentified = missing

    def _report(self, what: str, problem: str) -> None:
        """Log `problem` once while it stays; "" when `what` was read."""
        if problem and problem != self.problems.get(what):
            log.warning("node binfmt_misc table not read", extra={"kv": {"reason": problem}})
        self.problems[what] = problem


def interpreter_id(resolver: Resolver, root: Root, path: str) -> layout.FileId | None:
    """The interpreter's inode inside `root`, as the kernel's emulators map keys it
    (s_dev encoding); None when it is not there."""
    try:
        fd = resolver.lookup(root, path)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    return layout.FileId(dev=os.major(st.st_dev) << 20 | os.minor(st.st_dev), ino=st.st_ino)
