"""A private containerd with its CRI plugin, images built here, and a small CRI test client.

Nothing is pulled: the pause image holds a static musl ``pause`` compiled on the spot,
the workload image a static host busybox plus a foreign-architecture busybox, and both
are assembled as OCI archives and imported with ``ctr images import``. containerd runs
with its own root, state and sockets, so it neither needs nor disturbs a node's own.

Run ``dev/containerd-test-env.sh`` to get one for manual poking.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import secrets
import shutil
import signal
import subprocess
import tarfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc  # type: ignore[import-untyped]

from execwatch.attribution.cri import api_pb2 as pb
from execwatch.attribution.cri.client import CriClient
from tests.support.runtime.runc import (
    FOREIGN_BUSYBOX,
    FOREIGN_IN_ROOTFS,
    HOST_BUSYBOX,
    remove_pod_cgroups,
    require_tools,
)

NAMESPACE = "k8s.io"
PAUSE_IMAGE = "docker.io/execwatch/pause:test"
APP_IMAGE = "docker.io/execwatch/app:test"
PAUSE_C = """
#include <signal.h>
#include <unistd.h>
static void quit(int sig) { (void)sig; _exit(0); }
int main(void) {
    signal(SIGINT, quit);
    signal(SIGTERM, quit);
    for (;;) pause();
}
"""


def build_pause(workdir: Path) -> Path:
    """The pod sandbox's pause process, static so the image needs nothing else."""
    if shutil.which("musl-gcc") is None:
        raise RuntimeError("musl-gcc is missing: run `dev/setup.sh --test` (musl-tools)")
    src = workdir / "pause.c"
    src.write_text(PAUSE_C)
    out = workdir / "pause"
    subprocess.run(["musl-gcc", "-static", "-Os", "-o", str(out), str(src)], check=True)
    return out


def _tar_entry(
    tar: tarfile.TarFile, name: str, data: bytes | None, mode: int, link: str = ""
) -> None:
    info = tarfile.TarInfo(name)
    info.mtime = 0
    info.mode = mode
    if link:
        info.type = tarfile.SYMTYPE
        info.linkname = link
        tar.addfile(info)
    elif data is None:
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
    else:
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


def oci_archive(
    dest: Path,
    image_name: str,
    files: dict[str, Path],
    symlinks: dict[str, str],
    entrypoint: list[str],
    architecture: str = "amd64",
) -> Path:
    """One-layer OCI image archive that ``ctr images import`` accepts."""
    layer_buf = io.BytesIO()
    with tarfile.open(fileobj=layer_buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs = sorted({str(Path(p).parent) for p in [*files, *symlinks]} | {"dev", "proc", "sys"})
        for d in dirs:
            if d != ".":
                _tar_entry(tar, d, None, 0o755)
        for name, src in sorted(files.items()):
            _tar_entry(tar, name, src.read_bytes(), 0o755)
        for name, target in sorted(symlinks.items()):
            _tar_entry(tar, name, None, 0o777, link=target)
    layer = layer_buf.getvalue()
    config = json.dumps(
        {
            "architecture": architecture,
            "os": "linux",
            "config": {"Entrypoint": entrypoint, "Env": ["PATH=/bin"]},
            "rootfs": {"type": "layers", "diff_ids": [_digest(layer)]},
        }
    ).encode()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": _descriptor("application/vnd.oci.image.config.v1+json", config),
            "layers": [_descriptor("application/vnd.oci.image.layer.v1.tar", layer)],
        }
    ).encode()
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                **_descriptor("application/vnd.oci.image.manifest.v1+json", manifest),
                "annotations": {
                    "io.containerd.image.name": image_name,
                    "org.opencontainers.image.ref.name": image_name.rpartition(":")[2],
                },
            }
        ],
    }
    with tarfile.open(dest, "w") as tar:
        _tar_entry(tar, "oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode(), 0o644)
        _tar_entry(tar, "index.json", json.dumps(index).encode(), 0o644)
        for blob in (layer, config, manifest):
            _tar_entry(tar, f"blobs/sha256/{_digest(blob)[7:]}", blob, 0o644)
    return dest


def oci_archive_of(dest: Path, image_name: str, root: Path, entrypoint: list[str]) -> Path:
    """The same, from a directory tree: its regular files and symbolic links."""
    files: dict[str, Path] = {}
    symlinks: dict[str, str] = {}
    for path in sorted(root.rglob("*")):
        name = str(path.relative_to(root))
        if path.is_symlink():
            symlinks[name] = os.readlink(path)
        elif path.is_file():
            files[name] = path
    return oci_archive(dest, image_name, files, symlinks, entrypoint)


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _descriptor(media_type: str, data: bytes) -> dict[str, object]:
    return {"mediaType": media_type, "digest": _digest(data), "size": len(data)}


def containerd_config(
    root: Path, state: Path, socket: Path, cni: tuple[str, str] | None = None
) -> str:
    """`cni`: (bin_dir, conf_dir); by default empty directories under `root` (no pod network)."""
    cri = '[plugins."io.containerd.grpc.v1.cri"'
    cni_bin, cni_conf = cni or (f"{root}/cni/bin", f"{root}/cni/conf")
    return f"""version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "{socket}"
[ttrpc]
  address = "{socket}.ttrpc"
[debug]
  level = "info"
[metrics]
  address = ""
{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  disable_apparmor = true
  restrict_oom_score_adj = true
{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
{cri}.cni]
  bin_dir = "{cni_bin}"
  conf_dir = "{cni_conf}"
[plugins."io.containerd.internal.v1.opt"]
  path = "{root}/opt"
"""


@dataclass
class Pod:
    """A pod sandbox created through CRI, the way the kubelet would (cgroupfs driver)."""

    uid: str
    name: str
    namespace: str
    qos: str
    sandbox_id: str
    config: pb.PodSandboxConfig
    containers: dict[str, str] = field(default_factory=dict)  # name -> container id

    @property
    def cgroup_parent(self) -> str:
        return _cgroup_parent(self.qos, self.uid)


def _cgroup_parent(qos: str, uid: str) -> str:
    return f"/kubepods/pod{uid}" if qos == "guaranteed" else f"/kubepods/{qos}/pod{uid}"


class Containerd:
    """A private containerd process; ``cri`` is a client for its CRI socket."""

    def __init__(
        self, workdir: Path, cni: tuple[str, str] | None = None, *, own_mounts: bool = False
    ) -> None:
        require_tools()
        for tool in ("containerd", "ctr", "containerd-shim-runc-v2"):
            if shutil.which(tool) is None:
                raise RuntimeError(f"{tool} is missing: run `dev/setup.sh --test` (containerd)")
        self.workdir = workdir
        self.cni = cni
        # In a mount namespace of its own, its rootfs mounts are seen only through its shims.
        self.own_mounts = own_mounts
        self.root = workdir / "root"
        self.run_dir = Path(f"/run/ew-ctd-{secrets.token_hex(4)}")  # short: sun_path is small
        self.state = self.run_dir / "state"
        self.socket = self.run_dir / "containerd.sock"
        self.log = workdir / "containerd.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.pods: list[Pod] = []
        self._channel: grpc.Channel | None = None
        self.cri: CriClient | None = None

    def start(self, timeout: float = 30) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.state.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "config.toml"
        config.write_text(containerd_config(self.root, self.state, self.socket, self.cni))
        with self.log.open("wb") as log:
            unshare = ["unshare", "--mount", "--propagation", "private"] if self.own_mounts else []
            self.process = subprocess.Popen(
                [*unshare, "containerd", "--config", str(config)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.cri = CriClient(self.socket)
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"containerd exited: {self.log.read_text()[-3000:]}")
            try:
                self.cri.version(1.0)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"containerd CRI did not come up: {self.log.read_text()[-3000:]}"
                    ) from None
                time.sleep(0.1)
        self._channel = grpc.insecure_channel(f"unix://{self.socket}")
        self._import_images()

    def _import_images(self) -> None:
        images = self.workdir / "images"
        images.mkdir(exist_ok=True)
        shutil.copy2(FOREIGN_BUSYBOX, images / "app-foreign")
        pause = build_pause(images)
        applets = {f"bin/{a}": "busybox" for a in ("sh", "sleep", "true", "echo", "cat")}
        archives = [
            oci_archive(images / "pause.tar", PAUSE_IMAGE, {"pause": pause}, {}, ["/pause"]),
            oci_archive(
                images / "app.tar",
                APP_IMAGE,
                {
                    "bin/busybox": HOST_BUSYBOX,
                    FOREIGN_IN_ROOTFS.lstrip("/"): FOREIGN_BUSYBOX,
                },
                applets,
                ["/bin/sh"],
            ),
        ]
        for archive in archives:
            self.import_image(archive)

    def import_image(self, archive: Path) -> None:
        subprocess.run(
            [
                "ctr",
                "--address",
                str(self.socket),
                "-n",
                NAMESPACE,
                "images",
                "import",
                "--snapshotter",
                "overlayfs",
                str(archive),
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )

    def _rpc(
        self, method: str, request: object, response: type[object], timeout: float = 30
    ) -> object:
        assert self._channel is not None
        stub = self._channel.unary_unary(
            f"/runtime.v1.RuntimeService/{method}",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=response.FromString,  # type: ignore[attr-defined]
        )
        return stub(request, timeout=timeout)

    def run_pod(
        self,
        name: str,
        namespace: str = "default",
        qos: str = "besteffort",
        labels: dict[str, str] | None = None,
    ) -> Pod:
        uid = str(uuid.uuid4())
        pod_labels = {
            "io.kubernetes.pod.name": name,
            "io.kubernetes.pod.namespace": namespace,
            "io.kubernetes.pod.uid": uid,
            **(labels or {}),
        }
        config = pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=name, uid=uid, namespace=namespace, attempt=0),
            log_directory=str(self.workdir / "logs" / uid),
            labels=pod_labels,
            linux=pb.LinuxPodSandboxConfig(
                cgroup_parent=_cgroup_parent(qos, uid),
                security_context=pb.LinuxSandboxSecurityContext(
                    namespace_options=pb.NamespaceOption(network=pb.NODE, pid=pb.CONTAINER)
                ),
            ),
        )
        (self.workdir / "logs" / uid).mkdir(parents=True, exist_ok=True)
        resp = self._rpc(
            "RunPodSandbox",
            pb.RunPodSandboxRequest(config=config),
            pb.RunPodSandboxResponse,
            timeout=60,
        )
        assert isinstance(resp, pb.RunPodSandboxResponse)
        pod = Pod(uid, name, namespace, qos, resp.pod_sandbox_id, config)
        self.pods.append(pod)
        return pod

    def foreign_path(self, pod: Pod) -> str:
        """Where containers of this pod find the foreign binary: a path unique to the pod,
        mounted like a hostPath volume, so that no other test run's failure matches it."""
        host_dir = self.workdir / "foreign" / pod.uid
        host_dir.mkdir(parents=True, exist_ok=True)
        if not (host_dir / "app").exists():
            os.link(self.workdir / "images" / "app-foreign", host_dir / "app")
        return f"/x/{pod.uid}/app"

    def create_container(
        self,
        pod: Pod,
        name: str,
        command: list[str],
        start: bool = True,
        image: str = APP_IMAGE,
    ) -> str:
        mounts = [
            pb.Mount(
                container_path=f"/x/{pod.uid}",
                host_path=str(self.workdir / "foreign" / pod.uid),
                readonly=True,
            )
        ]
        self.foreign_path(pod)
        config = pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name=name, attempt=0),
            image=pb.ImageSpec(image=image),
            command=command,
            mounts=mounts,
            labels={
                "io.kubernetes.pod.name": pod.name,
                "io.kubernetes.pod.namespace": pod.namespace,
                "io.kubernetes.pod.uid": pod.uid,
                "io.kubernetes.container.name": name,
            },
            log_path=f"{name}/0.log",
            linux=pb.LinuxContainerConfig(
                security_context=pb.LinuxContainerSecurityContext(
                    namespace_options=pb.NamespaceOption(network=pb.NODE, pid=pb.CONTAINER)
                )
            ),
        )
        resp = self._rpc(
            "CreateContainer",
            pb.CreateContainerRequest(
                pod_sandbox_id=pod.sandbox_id, config=config, sandbox_config=pod.config
            ),
            pb.CreateContainerResponse,
        )
        assert isinstance(resp, pb.CreateContainerResponse)
        pod.containers[name] = resp.container_id
        if start:
            self.start_container(resp.container_id)
        return resp.container_id

    def start_container(self, container_id: str) -> None:
        """StartContainer; a wrong-arch entrypoint may fail here or just after, as on a node."""
        with contextlib.suppress(grpc.RpcError):
            self._rpc(
                "StartContainer",
                pb.StartContainerRequest(container_id=container_id),
                pb.StartContainerResponse,
            )

    def container_state(self, container_id: str) -> int:
        resp = self._rpc(
            "ContainerStatus",
            pb.ContainerStatusRequest(container_id=container_id),
            pb.ContainerStatusResponse,
        )
        assert isinstance(resp, pb.ContainerStatusResponse)
        return int(resp.status.state)

    def wait_exited(self, container_id: str, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while self.container_state(container_id) != pb.CONTAINER_EXITED:
            if time.monotonic() > deadline:
                raise AssertionError(f"container {container_id[:12]} did not exit")
            time.sleep(0.05)

    def exec_sync(self, container_id: str, cmd: list[str]) -> int:
        try:
            resp = self._rpc(
                "ExecSync",
                pb.ExecSyncRequest(container_id=container_id, cmd=cmd, timeout=10),
                pb.ExecSyncResponse,
            )
        except grpc.RpcError:
            return -1
        assert isinstance(resp, pb.ExecSyncResponse)
        return int(resp.exit_code)

    def remove_container(self, container_id: str) -> None:
        with contextlib.suppress(grpc.RpcError):
            self._rpc(
                "StopContainer",
                pb.StopContainerRequest(container_id=container_id, timeout=0),
                pb.StopContainerResponse,
            )
        self._rpc(
            "RemoveContainer",
            pb.RemoveContainerRequest(container_id=container_id),
            pb.RemoveContainerResponse,
        )

    def remove_pod(self, pod: Pod) -> None:
        """What the kubelet does when a pod is deleted: its containers and sandbox go."""
        with contextlib.suppress(grpc.RpcError):
            self._rpc(
                "StopPodSandbox",
                pb.StopPodSandboxRequest(pod_sandbox_id=pod.sandbox_id),
                pb.StopPodSandboxResponse,
                timeout=60,
            )
        with contextlib.suppress(grpc.RpcError):
            self._rpc(
                "RemovePodSandbox",
                pb.RemovePodSandboxRequest(pod_sandbox_id=pod.sandbox_id),
                pb.RemovePodSandboxResponse,
                timeout=60,
            )
        remove_pod_cgroups(pod.cgroup_parent)
        if pod in self.pods:
            self.pods.remove(pod)

    def stop(self) -> None:
        """Remove every pod, stop containerd and its shims, unmount and delete its dirs."""
        try:
            for pod in list(self.pods):
                self.remove_pod(pod)
        finally:
            if self._channel is not None:
                self._channel.close()
            if self.cri is not None:
                self.cri.close()
            if self.process is not None and self.process.poll() is None:
                self.process.send_signal(signal.SIGTERM)
                try:
                    self.process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait(timeout=10)
            for pid, sock in self._our_shims():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                sock.unlink(missing_ok=True)
            self._unmount_below(self.workdir)
            self._unmount_below(self.run_dir)
            shutil.rmtree(self.run_dir, ignore_errors=True)
            shutil.rmtree(self.root, ignore_errors=True)

    def _our_shims(self) -> Iterator[tuple[int, Path]]:
        """Shims this containerd started (they name its socket on their command line), and
        the socket each listens on: containerd 1.6 puts it in /run/containerd/s, named by
        the sha256 of `<address>/<namespace>/<id>` (runtime/v2/shim's SocketAddress)."""
        needle = str(self.socket).encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if b"containerd-shim" in cmdline and needle in cmdline:
                yield int(entry.name), _shim_socket(cmdline.split(b"\0"))

    @staticmethod
    def _unmount_below(top: Path) -> None:
        prefix = str(top.resolve())
        mounts = [
            line.split()[4]
            for line in Path("/proc/self/mountinfo").read_text().splitlines()
            if line.split()[4].startswith(prefix)
        ]
        for mountpoint in sorted(mounts, key=len, reverse=True):
            subprocess.run(["umount", "-l", mountpoint], capture_output=True, check=False)


def _shim_socket(argv: list[bytes]) -> Path:
    args = {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith(b"-")}
    key = b"/".join(
        (args.get(b"-address", b""), args.get(b"-namespace", b""), args.get(b"-id", b""))
    )
    return Path("/run/containerd/s") / hashlib.sha256(key).hexdigest()


def main() -> None:
    """dev/containerd-test-env.sh: start one and keep it until Ctrl-C."""
    import tempfile

    workdir = Path(tempfile.mkdtemp(prefix="ew-containerd-"))
    ctd = Containerd(workdir)
    ctd.start()
    print(f"containerd CRI socket: {ctd.socket}\nlog: {ctd.log}\nCtrl-C stops and cleans up")
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        ctd.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
