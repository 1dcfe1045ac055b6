"""Root filesystems built from the host's real Debian files, and programs run inside them.

A root holds a binary, the libraries it needs (found with the real loader's `ldd`) minus
the ones a test leaves out, and a loader at the binary's PT_INTERP path. run_in_root
forks a keeper that chroots into the root and runs the program there, then lingers: the
early-death diagnosis finds the dead program's root through that live parent, as it
finds a container's through its rootfs mount.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
NEWER = REPO / ".cache" / "newer"
GLIBC_LOADER = "/lib64/ld-linux-x86-64.so.2"
MUSL_LOADER = "/lib/ld-musl-x86_64.so.1"
CLONE_NEWNS = 0x00020000
LDD_LINE = re.compile(r"^\s*(\S+) => (/\S+) \(")


def needed_libraries(*binaries: str | Path) -> dict[str, Path]:
    """soname -> host path of every library the binaries load (the loader's own answer)."""
    out: dict[str, Path] = {}
    for binary in binaries:
        text = subprocess.run(
            ["ldd", str(binary)], capture_output=True, text=True, check=False
        ).stdout
        for line in text.splitlines():
            if m := LDD_LINE.match(line):
                out[m.group(1)] = Path(m.group(2))
    return out


def copy_into(root: Path, source: Path, dest: str) -> Path:
    target = root / dest.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(source.resolve(), target)
    return target


def glibc_root(
    root: Path,
    binaries: dict[str, Path],
    *,
    omit: Iterable[str] = (),
    extra_libraries: dict[str, Path] | None = None,
) -> Path:
    """binaries (path in root -> host file), their libraries but `omit`, and ld.so."""
    libraries = needed_libraries(*binaries.values()) | (extra_libraries or {})
    for dest, source in binaries.items():
        copy_into(root, source, dest)
    skipped = set(omit)
    for soname, path in libraries.items():
        if soname not in skipped:
            copy_into(root, path, f"/usr/lib/x86_64-linux-gnu/{soname}")
    copy_into(root, Path(GLIBC_LOADER), GLIBC_LOADER)
    return root


def gcompat_root(root: Path, *, loader_link: bool) -> Path:
    """A musl root holding a glibc C++ program; with loader_link, gcompat's
    /lib64/ld-linux-x86-64.so.2 -> musl's loader."""
    glibc_root(root, {"/usr/bin/tbl": Path("/usr/bin/tbl")})
    os.remove(root / "lib64/ld-linux-x86-64.so.2")
    copy_into(root, Path(MUSL_LOADER).resolve(), MUSL_LOADER)
    if loader_link:
        os.symlink(MUSL_LOADER, root / "lib64/ld-linux-x86-64.so.2")
    (root / "etc").mkdir()
    (root / "etc/ld-musl-x86_64.path").write_text("/usr/lib/x86_64-linux-gnu\n")
    return root


def newer_package(name: str) -> Path:
    """A package of a newer Debian release, unpacked by dev/fetch-newer.sh."""
    if not (NEWER / ".complete-v1").exists():
        pytest.fail(f"{NEWER} is missing: run dev/fetch-newer.sh (make test does)")
    return NEWER / name


@dataclass(frozen=True)
class Outcome:
    pid: int
    exit_code: int | None
    signal: int | None


class Keepers:
    """Forks keepers that run one program in a root and then stay alive for a while."""

    def __init__(self) -> None:
        self._pids: list[int] = []

    def run(
        self,
        argv: list[str],
        *,
        root: Path | None = None,
        linger: float = 2.0,
        own_mounts: bool = False,
    ) -> Outcome:
        """own_mounts: the keeper first enters a mount namespace of its own (a container's
        root is in one), so once it is gone nothing on the host leads to that root."""
        r, w = os.pipe()
        keeper = os.fork()
        if keeper == 0:  # never returns
            os.close(r)
            null = os.open("/dev/null", os.O_RDWR)  # before the chroot: the root has no /dev
            try:
                if own_mounts and ctypes.CDLL(None, use_errno=True).unshare(CLONE_NEWNS):
                    raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
                if root is not None:
                    os.chroot(root)
                    os.chdir("/")
                pid = os.fork()
                if pid == 0:
                    try:
                        for fd in (0, 1, 2):
                            os.dup2(null, fd)
                        os.execv(argv[0], argv)
                    finally:
                        os._exit(255)
                _, status = os.waitpid(pid, 0)
                os.write(w, f"{pid} {status}".encode())
                time.sleep(linger)
            finally:
                os._exit(0)
        os.close(w)
        pid, status = (int(x) for x in os.read(r, 64).split())
        os.close(r)
        self._pids.append(keeper)
        if os.WIFSIGNALED(status):
            return Outcome(pid, None, os.WTERMSIG(status))
        return Outcome(pid, os.WEXITSTATUS(status), None)

    def reap(self) -> None:
        for pid in self._pids:
            os.waitpid(pid, 0)
        self._pids.clear()


@pytest.fixture
def keepers() -> Iterator[Keepers]:
    k = Keepers()
    yield k
    k.reap()


def build_musl(tmp_path: Path, name: str, source: str, compiler: str = "musl-gcc") -> Path:
    """A small program built with Debian's musl-gcc (musl-tools): PT_INTERP is musl's
    (with compiler="gcc", glibc's)."""
    c = tmp_path / f"{name}.c"
    c.write_text(source)
    binary = tmp_path / name
    subprocess.run([compiler, "-O2", "-o", binary, c], check=True)
    return binary
