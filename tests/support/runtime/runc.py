"""Real runc containers placed in kubelet-shaped cgroups, for tests and the benchmark.

runc's systemd cgroup driver needs a running systemd, which these machines lack
(``runc --systemd-cgroup`` fails with "systemd not running on this host"), so the
systemd layout is produced with runc's cgroupfs driver and a cgroupsPath written in
the systemd driver's slice/scope naming: the directories the kernel sees are the same.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import shutil
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

from execwatch.attribution.mounts import HierarchyMount, cgroup_mounts

REPO = Path(__file__).resolve().parents[3]
FOREIGN_ARCH = "arm64"
FOREIGN_BUSYBOX = REPO / ".cache" / "foreign" / FOREIGN_ARCH / "root" / "usr" / "bin" / "busybox"
HOST_BUSYBOX = Path("/usr/bin/busybox")
FOREIGN_IN_ROOTFS = f"/bin/app-{FOREIGN_ARCH}"
APPLETS = ("sh", "sleep", "true", "cat", "echo")


def require_tools() -> None:
    """Fail loudly, naming the setup step, when something the tests need is missing."""
    missing = [str(p) for p in (HOST_BUSYBOX, FOREIGN_BUSYBOX) if not p.exists()]
    if shutil.which("runc") is None:
        missing.append("runc")
    if missing:
        raise RuntimeError(f"missing {', '.join(missing)}: run `dev/setup.sh --test`")


def build_rootfs(root: Path) -> Path:
    """A tiny root: a static host busybox (healthy processes) and a foreign-arch one."""
    require_tools()
    (root / "bin").mkdir(parents=True, exist_ok=True)
    for d in ("proc", "dev", "sys", "tmp", "etc"):
        (root / d).mkdir(exist_ok=True)
    shutil.copy2(HOST_BUSYBOX, root / "bin" / "busybox")
    for applet in APPLETS:
        link = root / "bin" / applet
        if not link.is_symlink():
            link.symlink_to("busybox")
    shutil.copy2(FOREIGN_BUSYBOX, root / FOREIGN_IN_ROOTFS.lstrip("/"))
    return root


@dataclass(frozen=True)
class KubeletCgroup:
    """Where a kubelet would put one container, in one of the two drivers' layouts."""

    driver: str  # "systemd" or "cgroupfs"
    qos: str  # "guaranteed", "burstable" or "besteffort"
    pod_uid: str
    container_id: str
    prefix: str = "cri-containerd"

    @classmethod
    def new(cls, driver: str, qos: str = "besteffort") -> KubeletCgroup:
        return cls(driver, qos, str(uuid.uuid4()), secrets.token_hex(32))

    @property
    def pod_path(self) -> str:
        if self.driver == "systemd":
            uid = self.pod_uid.replace("-", "_")
            if self.qos == "guaranteed":
                return f"/kubepods.slice/kubepods-pod{uid}.slice"
            return f"/kubepods.slice/kubepods-{self.qos}.slice/kubepods-{self.qos}-pod{uid}.slice"
        qos = "" if self.qos == "guaranteed" else f"/{self.qos}"
        return f"/kubepods{qos}/pod{self.pod_uid}"

    @property
    def path(self) -> str:
        if self.driver == "systemd":
            return f"{self.pod_path}/{self.prefix}-{self.container_id}.scope"
        return f"{self.pod_path}/{self.container_id}"


def _hierarchies() -> list[HierarchyMount]:
    mounts = cgroup_mounts()
    found = {m.mountpoint: m for m in mounts.v1.values()}
    if mounts.unified is not None:
        found[mounts.unified.mountpoint] = mounts.unified
    return list(found.values())


def remove_pod_cgroups(pod_path: str) -> None:
    """Remove a pod's cgroup directories in every hierarchy. The shared kubepods and QoS
    parents stay until ``remove_empty_kubepods``: removing them while another container
    is being created under them would make that creation fail."""
    for mount in _hierarchies():
        top = mount.to_fs_path(pod_path)
        if top is None or not top.exists():
            continue
        for dirpath, _dirs, _files in sorted(os.walk(top), key=lambda t: -len(t[0])):
            _rmdir(Path(dirpath))


def remove_empty_kubepods() -> None:
    """At the end of a run: the kubepods trees the runtimes created, if nothing is left."""
    for mount in _hierarchies():
        for top in ("kubepods", "kubepods.slice"):
            root = mount.mountpoint / top
            if not root.is_dir():
                continue
            for dirpath, _dirs, _files in sorted(os.walk(root), key=lambda t: -len(t[0])):
                if not _rmdir(Path(dirpath)):
                    break


def _rmdir(path: Path) -> bool:
    try:
        path.rmdir()
        return True
    except OSError as exc:
        if exc.errno in (errno.ENOENT,):
            return True
        if exc.errno in (errno.ENOTEMPTY, errno.EBUSY):
            return False
        raise


class Runc:
    """runc with a private state root and one bundle per container."""

    def __init__(self, workdir: Path) -> None:
        require_tools()
        self.workdir = workdir
        self.state = workdir / "runc-state"
        self.rootfs = build_rootfs(workdir / "rootfs")
        self.started: list[str] = []

    def foreign_path(self, token: str) -> str:
        """A path to the foreign binary unique to one container, so that its failed exec
        cannot be confused with another's (other test runs may share this machine)."""
        link = self.rootfs / "bin" / f"app-{token}"
        if not link.is_symlink():
            link.symlink_to(Path(FOREIGN_IN_ROOTFS).name)
        return f"/bin/app-{token}"

    def _bundle(
        self, name: str, args: list[str], cgroups_path: str, rootfs: Path | None = None
    ) -> Path:
        bundle = self.workdir / "bundles" / name
        bundle.mkdir(parents=True, exist_ok=True)
        subprocess.run(["runc", "spec", "--bundle", str(bundle)], check=True)
        spec = json.loads((bundle / "config.json").read_text())
        spec["root"] = {"path": str(rootfs or self.rootfs), "readonly": True}
        spec["process"]["terminal"] = False
        spec["process"]["args"] = args
        spec["process"]["env"] = ["PATH=/bin"]
        spec["linux"]["cgroupsPath"] = cgroups_path
        spec["linux"]["namespaces"] = [
            n for n in spec["linux"]["namespaces"] if n["type"] != "network"
        ]
        (bundle / "config.json").write_text(json.dumps(spec))
        return bundle

    def run(self, cgroup: KubeletCgroup, args: list[str], timeout: float = 30) -> int:
        """Run a container in the foreground until it exits; runc then removes its cgroup."""
        bundle = self._bundle(cgroup.container_id[:12], args, cgroup.path)
        name = f"ew-{cgroup.container_id[:12]}"
        self.started.append(name)
        proc = subprocess.run(
            ["runc", "--root", str(self.state), "run", "--bundle", str(bundle), name],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
        )
        shutil.rmtree(bundle, ignore_errors=True)
        return proc.returncode

    def start_detached(
        self, cgroup: KubeletCgroup, args: list[str], rootfs: Path | None = None
    ) -> str:
        """`rootfs`: another root than the shared busybox one (it needs /proc, /dev, /sys)."""
        bundle = self._bundle(cgroup.container_id[:12], args, cgroup.path, rootfs)
        name = f"ew-{cgroup.container_id[:12]}"
        self.started.append(name)
        subprocess.run(
            [
                "runc",
                "--root",
                str(self.state),
                "run",
                "--detach",
                "--bundle",
                str(bundle),
                name,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=True,
            timeout=30,
        )
        return name

    def exec(self, name: str, args: list[str]) -> int:
        """A side process inside a running container (what `kubectl exec` ends up doing)."""
        proc = subprocess.run(
            ["runc", "--root", str(self.state), "exec", name, *args],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=30,
        )
        return proc.returncode

    def delete(self, name: str) -> None:
        subprocess.run(
            ["runc", "--root", str(self.state), "delete", "--force", name],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=30,
        )

    def cleanup(self) -> None:
        for name in self.started:
            self.delete(name)
        self.started.clear()
