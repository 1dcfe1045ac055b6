"""One image's layers, applied to a private directory on disk, for a run.

The same tar safety as the scan's MemoryFS (scan.layers): member paths through
`member_path` (nothing absolute, nothing climbing out), the image's read budget, the tar
entry budget, whiteouts and opaque directories as image-spec `layer.md` says. On disk
besides: every lookup goes through openat2(RESOLVE_IN_ROOT), so a symlink an earlier layer
planted cannot carry a later member outside the root; no device node, FIFO or socket is
made; setuid, setgid and sticky bits are dropped; the bytes written are capped.
"""

from __future__ import annotations

import errno
import os
import posixpath
import shutil
import stat
import tarfile
from dataclasses import dataclass

from execwatch.runnable.limits import Limits
from execwatch.runnable.openat2 import Resolver, Root
from execwatch.scan.errors import CorruptInput, LimitExceeded, ScanInputError
from execwatch.scan.layers import OPAQUE, WHITEOUT, bounded_tarinfo, member_path
from execwatch.scan.sources import ImageBudget, ImageSource, layer_stream
from execwatch.smoke.kernel import MNT_DETACH, Kernel
from execwatch.smoke.namespaces import MiB, private_tmpfs

# An image whose files take at most this many bytes is unpacked on a tmpfs of its run's
# own (smoke.namespaces.private_tmpfs): RAM, held while the run lasts, at most
# TMPFS_SIZE (the files plus a quarter for small files' page rounding). Larger, or where
# the memory (MemAvailable, the cgroup's memory.max) has not twice that to spare, or where
# no mount namespace can be made: the disk. An image whose declared layer sizes already
# add up past the bound goes straight to the disk; one that outgrows the tmpfs on the
# way starts again there.
TMPFS_BYTES = 256 * MiB
WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass
class Unpacked:
    files: int = 0
    bytes_written: int = 0
    skipped_special: int = 0  # device nodes, FIFOs, sockets: never made
    dropped_mode_bits: int = 0  # setuid/setgid/sticky files and directories
    on_tmpfs: bool = False  # a tmpfs of the run's own, else the disk


class TooBig(LimitExceeded):
    """The image's files outgrow the bytes they may take."""


class _Disk:
    """The root directory being written, addressed only through openat2 in its root."""

    def __init__(self, path: str, max_bytes: int) -> None:
        self.root = Root(os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC), path)
        self.resolver = Resolver()
        self.max_bytes = max_bytes
        self.stats = Unpacked()

    def close(self) -> None:
        self.root.close()

    def directory(self, path: str) -> int:
        """An O_PATH fd on directory `path` of the image, made (with its parents) if absent."""
        try:
            return self.resolver.lookup(self.root, path)
        except FileNotFoundError:
            parent, base = posixpath.split(path)
            fd = self.directory(parent)
            try:
                os.mkdir(base, 0o755, dir_fd=fd)
            except FileExistsError as exc:  # a symlink leading nowhere in the root
                raise ScanInputError(f"{path}: a symlink to nothing inside the image") from exc
            finally:
                os.close(fd)
            return self.resolver.lookup(self.root, path)

    def remove(self, parent: int, base: str) -> None:
        try:
            st = os.stat(base, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(base, dir_fd=parent)
        else:
            os.unlink(base, dir_fd=parent)


def unpack_root(
    image: ImageSource, dest: str, limits: Limits, max_bytes: int, tmpfs_bytes: int = TMPFS_BYTES
) -> Unpacked:
    """Every layer of `image` into the empty directory `dest`: on a tmpfs of this
    process's own (and its children's) when the image fits in `tmpfs_bytes` (see
    TMPFS_BYTES), else on the disk, up to `max_bytes`."""
    size = tmpfs_bytes + tmpfs_bytes // 4  # tmpfs: size=0 would be no bound at all
    fits = tmpfs_bytes > 0 and _declared(image) <= tmpfs_bytes and _spare_memory() >= 2 * size
    if fits and private_tmpfs(dest, size):
        unpacked = _on_tmpfs(image, dest, limits, tmpfs_bytes)
        if unpacked is not None:
            return unpacked
    return unpack_image(image, dest, limits, max_bytes)


def _on_tmpfs(image: ImageSource, dest: str, limits: Limits, max_bytes: int) -> Unpacked | None:
    """The image on the tmpfs mounted on `dest`; None when it outgrew it (the tmpfs is
    then unmounted, `dest` the empty directory below it)."""
    try:
        unpacked = unpack_image(image, dest, limits, max_bytes)
    except TooBig:
        pass
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
    else:
        unpacked.on_tmpfs = True
        return unpacked
    Kernel().umount(dest, MNT_DETACH)
    return None


def _declared(image: ImageSource) -> int:
    """The layers' declared (compressed) sizes added up; 0 for those that declare none."""
    return sum(layer.size or 0 for layer in image.layers)


def _spare_memory() -> int:
    """Bytes this process may still fill with tmpfs pages: the machine's MemAvailable,
    and its cgroup's memory.max less memory.current (cgroup v2) when that is lower."""
    spare = _meminfo_available()
    try:
        with open("/proc/self/cgroup") as f:
            path = f.read(4096).partition("0::")[2].split("\n", 1)[0]
        with open(f"/sys/fs/cgroup{path}/memory.max") as f:
            top = f.read(64).strip()
        with open(f"/sys/fs/cgroup{path}/memory.current") as f:
            used = int(f.read(64).strip())
    except (OSError, ValueError):
        return spare
    return spare if not top.isdigit() else min(spare, int(top) - used)


def _meminfo_available() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f.read(1 << 16).splitlines():
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def unpack_image(image: ImageSource, dest: str, limits: Limits, max_bytes: int) -> Unpacked:
    """Every layer of `image` into the empty directory `dest`."""
    disk = _Disk(dest, max_bytes)
    counter, entries = [0, 0], [0]
    budget = ImageBudget.start(image.label, limits)
    try:
        for layer in image.layers:
            with layer_stream(layer, limits, counter, budget) as stream:
                tar = tarfile.open(fileobj=stream, mode="r|", tarinfo=bounded_tarinfo(limits))  # type: ignore[call-overload]  # noqa: SIM115
                with tar:
                    _apply(disk, tar, layer.name, limits, entries, budget)
    except tarfile.HeaderError as exc:
        raise LimitExceeded(f"{image.label}: corrupt layer: {exc}") from exc
    except (tarfile.TarError, EOFError) as exc:
        raise CorruptInput(f"{image.label}: corrupt layer: {exc or type(exc).__name__}") from exc
    finally:
        disk.close()
    return disk.stats


def _apply(
    disk: _Disk, tar: tarfile.TarFile, layer: str, limits: Limits, entries: list[int],
    budget: ImageBudget,
) -> None:  # fmt: skip
    added: set[str] = set()
    for member in tar:
        entries[0] += 1
        if entries[0] > limits.max_entries:
            raise LimitExceeded(f"{layer}: more than {limits.max_entries} tar entries")
        budget.charge()
        path = member_path(member.name, layer)
        if path is None:
            continue
        parent_path, base = posixpath.split(path)
        parent = disk.directory(parent_path)
        try:
            if base == OPAQUE:
                _opaque(disk, parent, parent_path, added)
            elif base.startswith(WHITEOUT):
                disk.remove(parent, base[len(WHITEOUT) :])
            else:
                _member(disk, tar, member, parent, base, layer)
                added.add(path)
        finally:
            os.close(parent)


def _opaque(disk: _Disk, parent: int, directory: str, added: set[str]) -> None:
    for name in os.listdir(parent_fd := os.open(".", os.O_RDONLY | os.O_DIRECTORY, dir_fd=parent)):
        if posixpath.join(directory, name) not in added and not _has_added(directory, name, added):
            disk.remove(parent, name)
    os.close(parent_fd)


def _has_added(directory: str, name: str, added: set[str]) -> bool:
    prefix = posixpath.join(directory, name) + "/"
    return any(p.startswith(prefix) for p in added)


def _member(
    disk: _Disk, tar: tarfile.TarFile, member: tarfile.TarInfo, parent: int, base: str, layer: str
) -> None:
    mode = member.mode & 0o777
    if member.mode & 0o7000:
        disk.stats.dropped_mode_bits += 1
    if member.isdir():
        try:
            st = os.stat(base, dir_fd=parent, follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode):
                disk.remove(parent, base)
                os.mkdir(base, 0o700, dir_fd=parent)
        except FileNotFoundError:
            os.mkdir(base, 0o700, dir_fd=parent)
        os.chmod(base, mode | 0o700, dir_fd=parent, follow_symlinks=False)
        return
    disk.remove(parent, base)
    if member.issym():
        os.symlink(member.linkname, base, dir_fd=parent)
    elif member.islnk():
        _hardlink(disk, member, parent, base, layer)
    elif member.isreg():
        _file(disk, tar, member, parent, base, mode)
    else:
        disk.stats.skipped_special += 1


def _hardlink(disk: _Disk, member: tarfile.TarInfo, parent: int, base: str, layer: str) -> None:
    target = member_path(member.linkname, layer)
    try:
        fd = disk.resolver.lookup(disk.root, target or "/", follow=False)
    except OSError as exc:
        raise ScanInputError(
            f"{layer}: hardlink {member.name} -> {member.linkname}: no such file"
        ) from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ScanInputError(
                f"{layer}: hardlink {member.name} -> {member.linkname}: not a file"
            )
        os.link(f"/proc/self/fd/{fd}", base, dst_dir_fd=parent, follow_symlinks=True)
    finally:
        os.close(fd)


def _file(
    disk: _Disk, tar: tarfile.TarFile, member: tarfile.TarInfo, parent: int, base: str, mode: int
) -> None:
    data = tar.extractfile(member)
    assert data is not None
    disk.stats.bytes_written += member.size
    if disk.stats.bytes_written > disk.max_bytes:
        raise TooBig(f"the image unpacks to more than {disk.max_bytes} bytes")
    fd = os.open(base, WRITE_FLAGS, 0o600, dir_fd=parent)
    with os.fdopen(fd, "wb") as out:
        shutil.copyfileobj(data, out, 1 << 20)
        os.fchmod(out.fileno(), mode)
    disk.stats.files += 1


def remove_tree(path: str) -> None:
    """Remove an unpacked root whatever modes its image gave its directories."""
    for dirpath, dirnames, _ in os.walk(path):
        for name in dirnames:
            full = os.path.join(dirpath, name)
            if not os.path.islink(full):
                os.chmod(full, 0o700)
    shutil.rmtree(path, ignore_errors=True)
