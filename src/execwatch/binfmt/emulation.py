"""Which foreign architectures a node runs silently, through `binfmt_misc` emulators.

A `binfmt_misc` entry whose magic matches the ELF header of another machine hands every
such binary to its interpreter (usually a user-mode QEMU): the exec succeeds, and the
program runs slowly. The table is `/proc/sys/fs/binfmt_misc` (`fs/binfmt_misc.c`): one
file per entry, `register` and `status` beside them. Since Linux 6.7 every user namespace
can mount a table of its own, so a container's is read through `/proc/PID/root`.

The table is read within a budget: entries, bytes per entry and lines per entry.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from pathlib import Path

from execwatch.binfmt.machines import classify

TABLE = Path("/proc/sys/fs/binfmt_misc")
MAX_ENTRIES = 256  # the kernel has no limit; a real node registers a few dozen
MAX_ENTRY_BYTES = 4096  # an entry file is at most a page (fs/binfmt_misc.c: bm_entry_read)
_NOT_ENTRIES = frozenset({"register", "status"})
_ELF_MAGIC = b"\x7fELF"
_E_MACHINE = 18  # offset of e_machine in the ELF header: 16 bytes of e_ident, 2 of e_type
_FLAGS = "FPCO"


@dataclass(frozen=True)
class Emulator:
    """One enabled entry that runs ELF binaries of `arch` through `interpreter`."""

    name: str
    arch: str  # OCI architecture (arm64, riscv64, ...) or binutils' label when OCI has none
    interpreter: str
    flags: str  # the subset of F (fix binary), P (preserve argv[0]), C (credentials), O (open)


@dataclass(frozen=True)
class Table:
    """What one read of a binfmt_misc mount found."""

    enabled: bool  # the `status` file: a disabled table hands nothing to interpreters
    emulators: tuple[Emulator, ...]
    skipped: int  # entries not understood, over the budget, or vanished while read

    def foreign(self, node_arch: str) -> tuple[Emulator, ...]:
        """The emulators of architectures other than the node's own."""
        return tuple(e for e in self.emulators if e.arch != node_arch)


def read_table(path: Path = TABLE) -> Table | None:
    """The emulators registered at `path`, or None when no binfmt_misc is mounted there."""
    try:
        names = sorted(os.listdir(path))
    except (FileNotFoundError, NotADirectoryError):
        return None
    status = _read_small(path / "status")
    if status is None:
        return None
    emulators: list[Emulator] = []
    skipped = 0
    entries = [n for n in names if n not in _NOT_ENTRIES]
    skipped += max(0, len(entries) - MAX_ENTRIES)
    for name in entries[:MAX_ENTRIES]:
        text = _read_small(path / name)
        emulator = parse_entry(name, text) if text is not None else None
        if emulator is not None:
            emulators.append(emulator)
        elif text is None or _unplaced_elf_entry(text):
            skipped += 1
    return Table(status.strip() == "enabled", tuple(emulators), skipped)


def parse_entry(name: str, text: str) -> Emulator | None:
    """An enabled ELF-magic entry as an Emulator; None for anything else (disabled entries,
    extension matches, other magics such as Windows PE or Java class files)."""
    fields: dict[str, str] = {}
    lines = text.splitlines()[:16]
    if not lines or lines[0] != "enabled":
        return None
    for line in lines[1:]:
        key, _, value = line.partition(" ")
        fields[key.rstrip(":")] = value.strip()
    try:
        offset = int(fields.get("offset", "0"))
        magic = bytes.fromhex(fields.get("magic", ""))
        mask = bytes.fromhex(fields.get("mask", "ff" * len(magic)))
    except ValueError:
        return None
    arch = _elf_arch(offset, magic, mask)
    interpreter = fields.get("interpreter", "")
    if arch is None or not interpreter:
        return None
    flags = "".join(c for c in _FLAGS if c in fields.get("flags", ""))  # C implies O
    return Emulator(name, arch, interpreter, flags)


def _elf_arch(offset: int, magic: bytes, mask: bytes) -> str | None:
    """The architecture an ELF magic selects: class, byte order and e_machine must all be
    matched exactly by the mask, as qemu's and binfmt-support's entries do."""
    if offset != 0 or len(magic) < _E_MACHINE + 2 or len(mask) < len(magic):
        return None
    head = bytes(m & k for m, k in zip(magic, mask, strict=False))
    if head[:4] != _ELF_MAGIC or mask[:6] != b"\xff" * 6:
        return None
    if mask[_E_MACHINE : _E_MACHINE + 2] != b"\xff\xff":
        return None
    little = head[5] == 1
    machine = int.from_bytes(head[_E_MACHINE : _E_MACHINE + 2], "little" if little else "big")
    return classify(machine, head[4], little, 0).label


def _unplaced_elf_entry(text: str) -> bool:
    """An enabled ELF-magic entry this reader could not place: counted, never ignored."""
    return text.startswith("enabled") and "magic 7f454c46" in text


def _read_small(path: Path) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ELOOP, errno.EACCES, errno.EPERM):
            return None
        raise
    try:
        data = os.read(fd, MAX_ENTRY_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_ENTRY_BYTES:
        return None
    return data.decode("ascii", "replace")
