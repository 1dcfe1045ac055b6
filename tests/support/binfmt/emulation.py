"""A binfmt_misc table of its own, with Debian's user-mode QEMU registered in it, and the
arm64 binary it runs: what every emulation test (binfmt, probe, cluster) starts from.

The table lives in a user and mount namespace (Linux 6.7+ gives each user namespace its
own binfmt_misc), so the host's table is never touched. A test module takes the fixtures
by importing them (`binfmt_namespace`, `busybox_arm64`)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
EMULATORS = REPO / ".cache" / "emulators"
TABLE_IN_NAMESPACE = "/proc/sys/fs/binfmt_misc"
# qemu's own aarch64 entry (scripts/qemu-binfmt-conf.sh): ELF64, little endian, EM_AARCH64.
AARCH64_MAGIC = r"\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00"
AARCH64_MASK = r"\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff"


def qemu_aarch64() -> Path:
    """Debian's qemu-aarch64-static, fetched (never installed) by dev/fetch-emulators.sh."""
    binary = EMULATORS / "qemu-aarch64-static"
    if not (EMULATORS / ".complete-v1").exists():
        pytest.fail(f"{binary} is missing: run dev/fetch-emulators.sh (make test does)")
    return binary


def aarch64_entry(name: str, interpreter: Path, flags: str) -> str:
    """The `register` line of an aarch64 entry running `interpreter` with `flags`."""
    return f":{name}:M::{AARCH64_MAGIC}:{AARCH64_MASK}:{interpreter}:{flags}"


@dataclass
class BinfmtNamespace:
    """A sleeping process whose namespaces hold the table; commands run there via nsenter."""

    process: subprocess.Popen[bytes]

    @classmethod
    def start(cls, setup: str = "true", *args: str) -> BinfmtNamespace:
        """`setup`: shell commands run in the namespaces once the table is mounted, with
        `args` as $1, $2, ..."""
        script = (
            f"mount -t binfmt_misc binfmt_misc {TABLE_IN_NAMESPACE} && {setup} && echo ready"
            " && exec sleep 600"
        )
        unshare = ["unshare", "-U", "-m", "-r", "--propagation", "private"]
        process = subprocess.Popen(
            [*unshare, "sh", "-c", script, "-", *args], stdout=subprocess.PIPE
        )
        assert process.stdout is not None
        line = process.stdout.readline()
        if line != b"ready\n":
            process.kill()
            process.wait()
            pytest.fail(
                f"cannot mount binfmt_misc in a user namespace (Linux 6.7+), or {setup!r}"
                f" failed there: {line!r}"
            )
        return cls(process)

    @property
    def root(self) -> Path:
        """The namespace's root directory as the host (and the agent) reach it."""
        return Path(f"/proc/{self.process.pid}/root")

    @property
    def table(self) -> Path:
        """The namespace's table as the host (and the agent) reach it."""
        return Path(f"{self.root}{TABLE_IN_NAMESPACE}")

    def run(self, *argv: str | Path) -> subprocess.CompletedProcess[str]:
        """argv[0] exec'd as is: nsenter's execvp would hand a file it cannot run to sh."""
        target = ["nsenter", "-t", str(self.process.pid), "-U", "-m", "--preserve-credentials"]
        execv = [sys.executable, "-c", "import os, sys; os.execv(sys.argv[1], sys.argv[1:])"]
        return subprocess.run(
            [*target, *execv, *map(str, argv)], capture_output=True, text=True, timeout=60
        )

    def write(self, name: str, text: str) -> None:
        script = f"printf '%s' \"$1\" > {TABLE_IN_NAMESPACE}/{name}"
        done = self.run("/bin/sh", "-c", script, "-", text)
        assert done.returncode == 0, done.stderr

    def register(self, line: str) -> None:
        self.write("register", line)

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


@pytest.fixture
def binfmt_namespace() -> Iterator[BinfmtNamespace]:
    """A fresh, empty table for one test."""
    ns = BinfmtNamespace.start()
    try:
        yield ns
    finally:
        ns.stop()


@pytest.fixture(scope="module")
def busybox_arm64(foreign_root: Path) -> Path:
    """Debian's arm64 busybox (dev/fetch-foreign.sh), symlinks resolved: the path the kernel
    records for its exec."""
    return (foreign_root / "arm64" / "root" / "usr" / "bin" / "busybox").resolve()
