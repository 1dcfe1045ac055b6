"""A private Podman (Debian's podman 4.3): its own storage, state and events file, and its
Docker-compatible service (`podman system service`) on its own socket.

This host has cgroup v1 controllers with a cgroup2 hierarchy beside them: crun refuses
that ("cgroups in hybrid mode not supported"), so runc runs the containers, under the
cgroupfs manager (no systemd here): `/libpod_parent/libpod-<id>`. Podman's default
rlimits exceed this machine's hard limits, so each run gets its own.

Rootless (`RootlessPodman`): a user the harness creates, with subuid/subgid ranges, its
own runtime directory, native overlay storage in its home and its service socket where
Podman puts it (`/run/user/UID/podman/podman.sock`). Without systemd and with cgroup v1
controllers, rootless Podman manages no cgroup at all; each container is started from a
task placed in the unified cgroup a systemd user instance would give it,
`user.slice/user-UID.slice/user@UID.service/user.slice/libpod-<id>.scope`, which the
container inherits: the kernel sees the same directories as on a systemd host.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import time
from pathlib import Path

from tests.support.engines import unified_cgroup
from tests.support.engines.dockerd import unmount_below
from tests.support.wait import wait_until

ULIMITS = ("--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024")
USER_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"  # not root's: the user cannot read it


class Podman:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.socket = workdir / "podman.sock"
        self._service: subprocess.Popen[bytes] | None = None

    @property
    def command(self) -> list[str]:
        return ["podman"]

    @property
    def graph_root(self) -> Path:
        return self.workdir / "root"

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
                [
                    *self.command,
                    *self.flags,
                    "system",
                    "service",
                    "--time=0",
                    f"unix://{self.socket}",
                ],
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
            [*self.command, *self.flags, *args], capture_output=True, text=True, timeout=120
        )
        if check and out.returncode != 0:
            raise RuntimeError(f"podman {' '.join(args)}: {out.stderr.strip()}")
        return out

    def run(self, name: str, *args: str) -> subprocess.CompletedProcess[str]:
        """`podman run --rm`; its exit is not the point."""
        return self.podman("run", "--rm", *ULIMITS, "--name", name, *args, check=False)

    def load(self, archive: Path) -> None:
        self.podman("load", "-q", "-i", str(archive))

    def pod_create(self, name: str) -> str:
        """A pod with its infra container (Debian's catatonit), given the ulimits each run
        gets (`pod create` takes none: a containers.conf of its own); its id."""
        conf = self.workdir / "pod-containers.conf"
        limits = ", ".join(f'"{v}"' for v in ULIMITS[1::2])
        conf.write_text(f"[containers]\ndefault_ulimits = [{limits}]\n")
        out = subprocess.run(
            [*self.command, *self.flags, "pod", "create", "--name", name],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "CONTAINERS_CONF": str(conf)},
        )
        if out.returncode != 0:
            raise RuntimeError(f"podman pod create {name}: {out.stderr.strip()}")
        return out.stdout.strip().splitlines()[-1]

    def stop(self) -> None:
        if self._service is not None and self._service.poll() is None:
            os.killpg(self._service.pid, signal.SIGTERM)
            try:
                self._service.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self._service.pid, signal.SIGKILL)
                self._service.wait()
        self._service = None
        self.podman("pod", "rm", "--all", "--force", check=False)
        self.podman("rm", "--all", "--force", check=False)
        unmount_below(self.workdir)


class RootlessPodman(Podman):
    """`user`'s own Podman, created if missing; see the module's docstring."""

    def __init__(self, user: str) -> None:
        ensure_user(user)
        entry = pwd.getpwnam(user)
        self.user, self.uid, self.home = user, entry.pw_uid, Path(entry.pw_dir)
        self.runtime_dir = Path(f"/run/user/{self.uid}")
        self.runtime_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chown(self.runtime_dir, self.uid, entry.pw_gid)
        super().__init__(self.home / f"execwatch-{secrets.token_hex(4)}")
        self.socket = self.runtime_dir / "podman" / "podman.sock"

    @property
    def command(self) -> list[str]:
        env = [f"XDG_RUNTIME_DIR={self.runtime_dir}", f"HOME={self.home}", f"PATH={USER_PATH}"]
        return ["runuser", "-u", self.user, "--", "/usr/bin/env", *env, "/usr/bin/podman"]

    @property
    def flags(self) -> list[str]:
        state = self.runtime_dir / self.workdir.name
        return [
            "--storage-driver", "overlay",
            "--root", str(self.workdir / "root"),
            "--runroot", str(state / "run"),
            "--tmpdir", str(state / "tmp"),
            "--cgroup-manager", "cgroupfs",
            "--events-backend", "file",
            "--runtime", "runc",
        ]  # fmt: skip

    def start(self, timeout: float = 60) -> None:
        self.socket.parent.mkdir(exist_ok=True)
        shutil.chown(self.socket.parent, self.user, self.user)
        self.socket.unlink(missing_ok=True)  # a former session's
        self.workdir.mkdir(exist_ok=True)
        shutil.chown(self.workdir, self.user, self.user)
        super().start(timeout)

    def load(self, archive: Path) -> None:
        """From a copy the user can read."""
        copy = self.workdir / archive.name
        shutil.copyfile(archive, copy)
        shutil.chown(copy, self.user, self.user)
        super().load(copy)

    def run(self, name: str, *args: str) -> subprocess.CompletedProcess[str]:
        created = self.podman(
            "create", "--rm", "--network", "none", *ULIMITS, "--name", name, *args
        )
        container_id = created.stdout.strip().splitlines()[-1]
        scope = self.scope(container_id)
        scope.mkdir(parents=True)
        start = [*self.command, *self.flags, "start", "--attach", container_id]
        script = 'echo $$ > "$0/cgroup.procs" && exec "$@"'
        try:
            return subprocess.run(
                ["sh", "-c", script, str(scope), *start],
                capture_output=True,
                text=True,
                timeout=120,
            )
        finally:
            _rmdir_when_empty(scope)

    def scope(self, container_id: str) -> Path:
        service = f"/user.slice/user-{self.uid}.slice/user@{self.uid}.service"
        return unified_cgroup(f"{service}/user.slice/libpod-{container_id}.scope")

    def stop(self) -> None:
        super().stop()
        subprocess.run([*self.command, *self.flags, "unshare", "rm", "-rf", str(self.workdir)])
        shutil.rmtree(self.workdir, ignore_errors=True)
        self._stop_pause_process()
        shutil.rmtree(self.runtime_dir / self.workdir.name, ignore_errors=True)

    def _stop_pause_process(self) -> None:
        """The process rootless Podman keeps to hold the user's namespaces (its pid file is
        in the --tmpdir)."""
        pid_file = self.runtime_dir / self.workdir.name / "tmp" / "pause.pid"
        with contextlib.suppress(OSError, ValueError):
            pid = int(pid_file.read_text())
            if os.stat(f"/proc/{pid}").st_uid == self.uid:
                os.kill(pid, signal.SIGKILL)
            pid_file.unlink()


def _rmdir_when_empty(path: Path, timeout: float = 10) -> None:
    """conmon may stay in the scope a moment after the container's exit."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def ensure_user(user: str, first: int = 300000, count: int = 65536) -> None:
    """A login-less user with subordinate uid and gid ranges for its user namespaces."""
    try:
        pwd.getpwnam(user)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", user], check=True)
    for kind, path in (("uids", "/etc/subuid"), ("gids", "/etc/subgid")):
        with contextlib.suppress(FileNotFoundError), open(path) as f:
            if any(line.startswith(f"{user}:") for line in f):
                continue
        span = f"{first}-{first + count - 1}"
        subprocess.run(["usermod", f"--add-sub{kind}", span, user], check=True)
