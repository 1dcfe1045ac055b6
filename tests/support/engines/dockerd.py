"""A private dockerd (Debian's docker.io) with its own socket, data root and exec root.

It touches nothing of a system dockerd: no iptables rules, no bridge, its own containerd
(started by dockerd under its exec root). Images come from OCI archives the suite builds,
turned into docker-archives by skopeo (`docker load` reads only those).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from tests.support.wait import wait_until


class Dockerd:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.socket = workdir / "docker.sock"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def host(self) -> str:
        return f"unix://{self.socket}"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "DOCKER_HOST": self.host}

    def start(self, timeout: float = 60) -> None:
        if shutil.which("dockerd") is None:
            raise RuntimeError("dockerd is missing: run `dev/setup.sh --test` (docker.io)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = open(self.workdir / "dockerd.log", "ab")  # noqa: SIM115 - the daemon's for its life
        self._process = subprocess.Popen(
            [
                "dockerd",
                "-H",
                self.host,
                "--data-root",
                str(self.workdir / "data"),
                "--exec-root",
                str(self.workdir / "exec"),
                "--pidfile",
                str(self.workdir / "dockerd.pid"),
                "--iptables=false",
                "--bridge=none",
            ],
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        log.close()
        wait_until(self._answers, timeout=timeout, step=0.2)

    def _answers(self) -> bool:
        if self._process is not None and self._process.poll() is not None:
            tail = (self.workdir / "dockerd.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"dockerd exited {self._process.returncode}: {tail}")
        return self.docker("version", check=False).returncode == 0

    def docker(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        out = subprocess.run(
            ["docker", *args], env=self.env, capture_output=True, text=True, timeout=120
        )
        if check and out.returncode != 0:
            raise RuntimeError(f"docker {' '.join(args)}: {out.stderr.strip()}")
        return out

    def load_oci(self, archive: Path, name: str) -> None:
        docker_archive = archive.with_suffix(".docker.tar")
        docker_archive.unlink(missing_ok=True)
        subprocess.run(
            [
                "skopeo",
                "copy",
                "-q",
                f"oci-archive:{archive}",
                f"docker-archive:{docker_archive}:{name}",
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
        self.docker("load", "-q", "-i", str(docker_archive))

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM, as systemd stops it; the containers it ran are stopped with it."""
        if self._process is None:
            return
        if self._process.poll() is None:
            self._process.send_signal(signal.SIGTERM)
            try:
                self._process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self._process.pid, signal.SIGKILL)
                self._process.wait()
        self._process = None
        time.sleep(0.2)
        unmount_below(self.workdir)


def unmount_below(top: Path) -> None:
    """What an engine left mounted in its directories (overlays, its state's tmpfs)."""
    prefix = str(top) + "/"
    with open("/proc/self/mountinfo") as f:
        mounts = [p for line in f if (p := line.split()[4]).startswith(prefix)]
    for mount in reversed(mounts):
        subprocess.run(["umount", "-l", mount], check=False, capture_output=True)
