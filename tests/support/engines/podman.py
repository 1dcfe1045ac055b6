"""A private Podman (Debian's podman 4.3): its own storage, state and events file, and its
Docker-compatible service (`podman system service`) on its own socket.

This host has cgroup v1 controllers with a cgroup2 hierarchy beside them: crun refuses
that ("cgroups in hybrid mode not supported"), so runc runs the containers, under the
cgroupfs manager (no systemd here): `/libpod_parent/libpod-<id>`. Podman's default
rlimits exceed this machine's hard limits, so each run gets its own.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

from tests.support.engines.dockerd import unmount_below
from tests.support.wait import wait_until

ULIMITS = ("--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024")


class Podman:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.socket = workdir / "podman.sock"
        self._service: subprocess.Popen[bytes] | None = None

    @property
    def flags(self) -> list[str]:
        return [
            "--root", str(self.workdir / "root"),
            "--runroot", str(self.workdir / "run"),
            "--tmpdir", str(self.workdir / "tmp"),
            "--cgroup-manager", "cgroupfs",
            "--events-backend", "file",
            "--runtime", "runc",
        ]  # fmt: skip

    def start(self, timeout: float = 60) -> None:
        if shutil.which("podman") is None:
            raise RuntimeError("podman is missing: run `dev/setup.sh --test` (podman)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        with open(self.workdir / "service.log", "ab") as log:
            self._service = subprocess.Popen(
                ["podman", *self.flags, "system", "service", "--time=0", f"unix://{self.socket}"],
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        wait_until(self._answers, timeout=timeout, step=0.2)

    def _answers(self) -> bool:
        if self._service is not None and self._service.poll() is not None:
            tail = (self.workdir / "service.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"podman system service exited: {tail}")
        return self.socket.exists()

    def podman(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        out = subprocess.run(
            ["podman", *self.flags, *args], capture_output=True, text=True, timeout=120
        )
        if check and out.returncode != 0:
            raise RuntimeError(f"podman {' '.join(args)}: {out.stderr.strip()}")
        return out

    def run(self, name: str, *args: str) -> subprocess.CompletedProcess[str]:
        """`podman run --rm`; its exit is not the point."""
        return self.podman("run", "--rm", *ULIMITS, "--name", name, *args, check=False)

    def load(self, archive: Path) -> None:
        self.podman("load", "-q", "-i", str(archive))

    def stop(self) -> None:
        if self._service is not None and self._service.poll() is None:
            os.killpg(self._service.pid, signal.SIGTERM)
            try:
                self._service.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self._service.pid, signal.SIGKILL)
                self._service.wait()
        self._service = None
        self.podman("rm", "--all", "--force", check=False)
        unmount_below(self.workdir)
