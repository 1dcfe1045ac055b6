"""One real Kubernetes node on this machine, for tests and the node benchmark.

etcd, kube-apiserver, kube-controller-manager and kube-scheduler (dev/k8s-tools.sh builds
them), and a kubelet on a private containerd with runc, pods on a Linux bridge through
Debian's CNI plugins. No CoreDNS, no kube-proxy: the one Service address pods use, the
API server's (`kubernetes.default`), gets the DNAT rule kube-proxy would have written.
Versions and why (kubelet 1.35 for containerd 1.6, `failCgroupV1: false` for these
hybrid cgroups, ...): docs/install.md, "A single node for the tests".

Everything the node creates is removed by `stop()`: pods (deleted through the API, so
the kubelet tears them down), containerd and its shims and shim sockets, mounts under
the kubelet's directory, the cgroups under CGROUP_ROOT, the bridge, the DNAT rule, and
the ip_forward setting the bridge plugin turns on.

`python -m tests.support.kubenode.kubelet_node` starts one and keeps it until Ctrl-C (a
kubeconfig is printed).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml
from kubernetes import client

from tests.support.kube.apiserver import Proc, binary_dir, client_cert, free_port, make_pki
from tests.support.runtime.containerd import Containerd

NODE_NAME = "ew-node"
BRIDGE = "ew-node0"
POD_SUBNET = "10.213.0.0/24"
BRIDGE_MAC = "02:65:77:00:00:01"  # locally administered
NODE_IP = "10.213.0.1"  # the bridge's address: the node's InternalIP and the API server's
SERVICE_RANGE = "10.213.128.0/24"
KUBERNETES_SERVICE_IP = "10.213.128.1"
CGROUP_ROOT = "ew-node"  # the kubelet's cgroupRoot: apart from other tests' /kubepods
CGROUP_FS = Path("/sys/fs/cgroup")
CNI_PLUGINS = Path("/usr/lib/cni")
LOCK = Path("/run/execwatch-node.lock")
NAT_COMMENT = "execwatch-test-node"
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet")

T = TypeVar("T")


# The controller-manager's --resource-quota-sync-period (the default is 300 s): a quota on a
# new CRD is counted at the first full resync after the CRD is discovered.
QUOTA_RESYNC = 120.0


class NodeError(RuntimeError):
    pass


def wait_for(what: str, check: Callable[[], T | None], timeout: float, every: float = 0.5) -> T:
    """Poll `check` until it returns something truthy; AssertionError naming `what` if not."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


def find_node_binaries() -> dict[str, Path]:
    d = binary_dir()
    found = {name: d / name for name in COMPONENTS}
    missing = [str(p) for p in found.values() if not os.access(p, os.X_OK)]
    for tool in ("bridge", "host-local", "loopback"):
        if not (CNI_PLUGINS / tool).exists():
            missing.append(str(CNI_PLUGINS / tool))
    if shutil.which("iptables") is None:
        missing.append("iptables")
    if missing:
        raise NodeError(
            f"missing {', '.join(missing)}: run dev/setup.sh --test (dev/k8s-tools.sh builds "
            "the Kubernetes binaries; Debian's containernetworking-plugins and iptables)"
        )
    return found


def controller_argvs(
    bins: dict[str, Path],
    kubeconfig: Path,
    pki: Path,
    workdir: Path,
    service_range: str,
    controller_manager_args: Sequence[str] = (),
    scheduler_args: Sequence[str] = (),
) -> dict[str, list[str]]:
    """kube-controller-manager and kube-scheduler against the API server of `kubeconfig`,
    `pki` holding make_pki's CA and ServiceAccount key: this node's, and tests/fleet's."""
    return {
        "kube-controller-manager": [
            str(bins["kube-controller-manager"]),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}",
            f"--service-cluster-ip-range={service_range}",
            "--bind-address=127.0.0.1",
            f"--secure-port={free_port()}",
            f"--cert-dir={workdir / 'kcm-certs'}",
            "--leader-elect=false",
            "--use-service-account-credentials=false",
            "--v=1",
            *controller_manager_args,
        ],
        "kube-scheduler": [
            str(bins["kube-scheduler"]),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={free_port()}",
            f"--cert-dir={workdir / 'scheduler-certs'}",
            "--leader-elect=false",
            "--v=1",
            *scheduler_args,
        ],
    }


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    if check and out.returncode != 0:
        raise NodeError(f"{' '.join(argv)}: {out.stderr.strip()}")
    return out


@dataclass
class Node:
    """The control plane and one kubelet; `admin` gives system:masters clients."""

    workdir: Path
    bins: dict[str, Path] = field(default_factory=find_node_binaries)
    procs: dict[str, Proc] = field(default_factory=dict)
    containerd: Containerd | None = None
    port: int = 0
    started_at: float = 0.0
    _lock: int | None = None
    _ip_forward: str | None = None
    _netns_before: set[str] = field(default_factory=set)

    # -- paths and clients -------------------------------------------------------------

    @property
    def pki(self) -> Path:
        return self.workdir / "pki"

    @property
    def url(self) -> str:
        return f"https://{NODE_IP}:{self.port}"

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "admin.kubeconfig"

    def config(self) -> client.Configuration:
        cfg = client.Configuration()
        cfg.host = self.url
        cfg.ssl_ca_cert = str(self.pki / "ca.crt")
        cfg.cert_file = str(self.pki / "admin.crt")
        cfg.key_file = str(self.pki / "admin.key")
        return cfg

    def client(self) -> client.ApiClient:
        return client.ApiClient(self.config())

    def core(self) -> Any:
        return client.CoreV1Api(self.client())

    # -- start ---------------------------------------------------------------------------

    def start(self) -> None:
        self.started_at = time.monotonic()
        self._take_lock()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._network_up()
        self._make_pki()
        self._start_etcd()
        self._start_apiserver()
        self._start_controllers()
        self._start_containerd()
        self._start_kubelet()
        self.wait_node_ready()

    def _take_lock(self) -> None:
        """One node per machine: the bridge, the cgroup root and the DNAT rule are fixed."""
        fd = os.open(LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + 900
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(fd)
                    raise NodeError(f"another test node holds {LOCK} for 15 minutes") from None
                time.sleep(2)
        self._lock = fd

    def _network_up(self) -> None:
        _run("ip", "link", "del", BRIDGE, check=False)  # left over by a killed run
        _run("ip", "link", "add", BRIDGE, "type", "bridge")
        # A bridge whose MAC was never set takes its lowest port's, so it changes as pods come
        # and go, and a pod whose ARP entry still has the old one cannot answer the host.
        _run("ip", "link", "set", BRIDGE, "address", BRIDGE_MAC)
        _run("ip", "addr", "add", f"{NODE_IP}/24", "dev", BRIDGE)
        _run("ip", "link", "set", BRIDGE, "up")
        self._ip_forward = Path("/proc/sys/net/ipv4/ip_forward").read_text().strip()
        self._netns_before = _netns()
        conf = self.workdir / "cni" / "conf"
        conf.mkdir(parents=True, exist_ok=True)
        (conf / "10-ew-node.conflist").write_text(
            json.dumps(
                {
                    "cniVersion": "0.4.0",
                    "name": "ew-node",
                    "plugins": [
                        {
                            "type": "bridge",
                            "bridge": BRIDGE,
                            "isGateway": True,
                            "ipMasq": False,
                            "hairpinMode": True,
                            "ipam": {
                                "type": "host-local",
                                "ranges": [[{"subnet": POD_SUBNET, "gateway": NODE_IP}]],
                                "routes": [{"dst": "0.0.0.0/0"}],
                                "dataDir": str(self.workdir / "cni" / "ipam"),
                            },
                        }
                    ],
                }
            )
        )

    def _nat(self, op: str, port: int) -> subprocess.CompletedProcess[str]:
        return _run(
            "iptables", "-w", "-t", "nat", op, "PREROUTING", "-d", f"{KUBERNETES_SERVICE_IP}/32",
            "-p", "tcp", "--dport", "443", "-m", "comment", "--comment", NAT_COMMENT,
            "-j", "DNAT", "--to-destination", f"{NODE_IP}:{port}", check=op != "-D",
        )  # fmt: skip

    def _make_pki(self) -> None:
        sans = f"IP:{NODE_IP},IP:{KUBERNETES_SERVICE_IP},IP:127.0.0.1,DNS:kubernetes.default.svc"
        make_pki(self.pki, sans=sans)
        client_cert(self.pki, "admin", "/O=system:masters/CN=execwatch-test-admin")
        client_cert(self.pki, "kubelet", f"/O=system:nodes/CN=system:node:{NODE_NAME}")
        self._write_kubeconfig(self.kubeconfig, "admin")
        self._write_kubeconfig(self.workdir / "kubelet.kubeconfig", "kubelet")

    def _write_kubeconfig(self, path: Path, user: str) -> None:
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "node",
                    "cluster": {"server": "", "certificate-authority": str(self.pki / "ca.crt")},
                }
            ],
            "users": [
                {
                    "name": user,
                    "user": {
                        "client-certificate": str(self.pki / f"{user}.crt"),
                        "client-key": str(self.pki / f"{user}.key"),
                    },
                }
            ],
            "contexts": [{"name": "node", "context": {"cluster": "node", "user": user}}],
            "current-context": "node",
        }
        path.write_text(yaml.safe_dump(doc))

    def _set_server(self) -> None:
        for path in (self.kubeconfig, self.workdir / "kubelet.kubeconfig"):
            doc = yaml.safe_load(path.read_text())
            doc["clusters"][0]["cluster"]["server"] = self.url
            path.write_text(yaml.safe_dump(doc))

    def _proc(self, name: str, argv: list[str]) -> Proc:
        proc = Proc(name, argv, self.workdir / f"{name}.log")
        self.procs[name] = proc
        proc.start()
        return proc

    def _start_etcd(self) -> None:
        self.etcd_port, peer = free_port(), free_port()
        self._proc(
            "etcd",
            [
                str(self.bins["etcd"]),
                "--name=node",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{self.etcd_port}",
                f"--advertise-client-urls=http://127.0.0.1:{self.etcd_port}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=node=http://127.0.0.1:{peer}",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )

    def _start_apiserver(self) -> None:
        self.port = free_port()
        self._set_server()
        self._nat("-A", self.port)
        pki = self.pki
        self._proc(
            "kube-apiserver",
            [
                str(self.bins["kube-apiserver"]),
                f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
                f"--bind-address={NODE_IP}",
                f"--advertise-address={NODE_IP}",
                f"--secure-port={self.port}",
                f"--cert-dir={self.workdir / 'apiserver-certs'}",
                f"--tls-cert-file={pki / 'serving.crt'}",
                f"--tls-private-key-file={pki / 'serving.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                f"--kubelet-client-certificate={pki / 'admin.crt'}",
                f"--kubelet-client-key={pki / 'admin.key'}",
                "--authorization-mode=Node,RBAC",
                "--kubelet-preferred-address-types=InternalIP",
                "--enable-admission-plugins=NodeRestriction",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--service-account-issuer=https://kubernetes.default.svc",
                "--api-audiences=https://kubernetes.default.svc",
                f"--service-cluster-ip-range={SERVICE_RANGE}",
                "--allow-privileged=true",
                "--profiling=false",
                "--v=1",
            ],
        )
        self.wait_apiserver()

    def wait_apiserver(self, timeout: float = 120) -> None:
        ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        ctx.load_cert_chain(self.pki / "admin.crt", self.pki / "admin.key")

        def ready() -> bool:
            self._check_alive()
            try:
                with urllib.request.urlopen(self.url + "/readyz", context=ctx, timeout=2) as r:
                    return bool(r.status == 200)
            except OSError:
                return False

        wait_for("kube-apiserver /readyz", ready, timeout, every=0.25)

    def _start_controllers(self) -> None:
        # A quota resync every 2 minutes instead of the default 5: still longer than an
        # install and the agent's 30 s refusal grace (what test_story proves survives),
        # 3 minutes less of every `make test`.
        argvs = controller_argvs(
            self.bins, self.kubeconfig, self.pki, self.workdir, SERVICE_RANGE,
            controller_manager_args=[f"--resource-quota-sync-period={QUOTA_RESYNC:.0f}s"],
        )  # fmt: skip
        for name, argv in argvs.items():
            self._proc(name, argv)

    def _start_containerd(self) -> None:
        self.containerd = Containerd(
            self.workdir / "containerd",
            cni=(str(CNI_PLUGINS), str(self.workdir / "cni" / "conf")),
        )
        self.containerd.start()

    def import_image(self, archive: Path, timeout: float = 300) -> None:
        """`ctr -n k8s.io images import`: how images reach this node (there is no registry)."""
        assert self.containerd is not None
        subprocess.run(
            [
                "ctr", "--address", str(self.containerd.socket), "-n", "k8s.io", "images",
                "import", "--snapshotter", "overlayfs", str(archive),
            ],
            check=True, capture_output=True, timeout=timeout,
        )  # fmt: skip

    def _start_kubelet(self) -> None:
        assert self.containerd is not None
        root = self.workdir / "kubelet"
        for sub in ("root", "certs", "volume-plugins", "pod-logs"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        for hierarchy in self._cgroup_hierarchies():
            top = hierarchy / CGROUP_ROOT
            top.mkdir(exist_ok=True)
            # A new v1 cpuset starts with no CPUs and no memory nodes: give it the parent's.
            for knob in ("cpuset.cpus", "cpuset.mems"):
                if (top / knob).exists() and not (top / knob).read_text().strip():
                    (top / knob).write_text((hierarchy / knob).read_text())
        (root / "resolv.conf").write_text("nameserver 127.0.0.1\n")
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            # This host's cgroups are hybrid (v1 controllers); kubelets since 1.35 refuse
            # cgroup v1 unless told otherwise.
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",  # no systemd here
            "cgroupRoot": f"/{CGROUP_ROOT}",
            "failSwapOn": False,
            "containerRuntimeEndpoint": f"unix://{self.containerd.socket}",
            "resolvConf": str(root / "resolv.conf"),
            "podLogsDir": str(root / "pod-logs"),
            # Images exist only as imported here: never garbage-collect them.
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            # A shared machine's disk must not evict the test's pods.
            "evictionHard": {"memory.available": "50Mi", "nodefs.available": "1%",
                             "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
            "address": NODE_IP,
            "port": free_port(),
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": free_port(),
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(self.pki / "ca.crt")},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "clusterDomain": "cluster.local",
            "serializeImagePulls": False,
            "nodeStatusUpdateFrequency": "4s",
        }  # fmt: skip
        (root / "config.yaml").write_text(yaml.safe_dump(config))
        self.kubelet_root = root / "root"
        self._proc(
            "kubelet",
            [
                str(self.bins["kubelet"]),
                f"--config={root / 'config.yaml'}",
                f"--kubeconfig={self.workdir / 'kubelet.kubeconfig'}",
                f"--root-dir={self.kubelet_root}",
                f"--cert-dir={root / 'certs'}",
                f"--volume-plugin-dir={root / 'volume-plugins'}",
                f"--node-ip={NODE_IP}",
                f"--hostname-override={NODE_NAME}",
                "--v=1",
            ],
        )

    def wait_node_ready(self, timeout: float = 180) -> None:
        core = self.core()

        def ready() -> bool:
            self._check_alive()
            try:
                node = core.read_node(NODE_NAME)
            except client.ApiException:
                return False
            conds = {c.type: c.status for c in node.status.conditions or []}
            # The node lifecycle controller lifts the not-ready taint a little after Ready.
            return (
                conds.get("Ready") == "True"
                and not node.spec.unschedulable
                and not (node.spec.taints)
            )

        wait_for(f"node {NODE_NAME} Ready", ready, timeout)
        # Pods need the default ServiceAccount, which the controller-manager creates.
        wait_for(
            "ServiceAccount default/default",
            lambda: core.list_namespaced_service_account("default").items,
            60,
        )
        self.ready_after = time.monotonic() - self.started_at

    def _check_alive(self) -> None:
        for name, proc in self.procs.items():
            if not proc.alive():
                raise NodeError(f"{name} exited:\n{proc.tail()}")

    # -- stop ----------------------------------------------------------------------------

    def stop(self) -> None:
        """Delete every pod, stop every process, remove what the node left on the host."""
        if self._lock is None:
            return  # never started, or already stopped: the host's bridge may be another's
        try:
            if "kubelet" in self.procs and self.procs["kubelet"].alive():
                try:
                    self._drain()
                except Exception as exc:  # keep cleaning up; say why pods may be left
                    print(f"node: draining failed: {exc!r}", file=sys.stderr)
        finally:
            for name in reversed(list(self.procs)):
                self.procs[name].stop()
            if self.containerd is not None:
                self.containerd.stop()
            self._cleanup_host()

    def _drain(self, timeout: float = 90) -> None:
        """Delete all pods (DaemonSets and Deployments first, so nothing re-creates them)."""
        api = self.client()
        apps = client.AppsV1Api(api)
        core = client.CoreV1Api(api)
        for ns in core.list_namespace().items:
            name = ns.metadata.name
            for kind in ("daemon_set", "deployment", "replica_set"):
                for obj in getattr(apps, f"list_namespaced_{kind}")(name).items:
                    with contextlib.suppress(client.ApiException):  # gone with its owner
                        getattr(apps, f"delete_namespaced_{kind}")(obj.metadata.name, name)
        self._delete_custom("argoproj.io", "v1alpha1", "rollouts")
        for pod in core.list_pod_for_all_namespaces().items:
            with contextlib.suppress(client.ApiException):
                core.delete_namespaced_pod(
                    pod.metadata.name, pod.metadata.namespace, grace_period_seconds=1
                )
        wait_for(
            "every pod gone",
            lambda: not core.list_pod_for_all_namespaces().items,
            timeout,
            every=1,
        )

    def _delete_custom(self, group: str, version: str, plural: str) -> None:
        custom = client.CustomObjectsApi(self.client())
        try:
            items = custom.list_cluster_custom_object(group, version, plural)["items"]
        except client.ApiException:
            return
        for item in items:
            meta = item["metadata"]
            custom.delete_namespaced_custom_object(
                group, version, meta["namespace"], plural, meta["name"]
            )

    def _cleanup_host(self) -> None:
        if hasattr(self, "kubelet_root"):
            Containerd._unmount_below(self.kubelet_root)
        self._remove_cgroups()
        for ns in _netns() - self._netns_before:  # pods' network namespaces (CNI's)
            _run("ip", "netns", "delete", ns, check=False)
        if self.port:
            while self._nat("-D", self.port).returncode == 0:
                pass
        _run("ip", "link", "del", BRIDGE, check=False)
        if self._ip_forward is not None:
            Path("/proc/sys/net/ipv4/ip_forward").write_text(self._ip_forward + "\n")
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None

    @staticmethod
    def _cgroup_hierarchies() -> list[Path]:
        """Every mounted hierarchy: the v1 controllers and the unified one."""
        out = []
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            fields = line.split()
            sep = fields.index("-")
            if fields[sep + 1] in ("cgroup", "cgroup2") and fields[4].startswith(str(CGROUP_FS)):
                out.append(Path(fields[4]))
        return out

    def _remove_cgroups(self) -> None:
        """Kill what is still in them (a container whose shim was killed), then rmdir."""
        for hierarchy in self._cgroup_hierarchies():
            for procs in (hierarchy / CGROUP_ROOT).rglob("cgroup.procs"):
                with contextlib.suppress(OSError, ValueError):
                    for pid in procs.read_text().split():
                        os.kill(int(pid), signal.SIGKILL)
        # A killed task leaves its cgroup a moment later: retry for a few seconds.
        deadline = time.monotonic() + 10
        while self._cgroup_dirs() and time.monotonic() < deadline:
            for d in self._cgroup_dirs():
                with contextlib.suppress(OSError):
                    d.rmdir()
            time.sleep(0.1)

    def _cgroup_dirs(self) -> list[Path]:
        """Our cgroup directories, deepest first."""
        dirs = []
        for hierarchy in self._cgroup_hierarchies():
            top = hierarchy / CGROUP_ROOT
            if top.is_dir():
                dirs += [top, *(p for p in top.rglob("*") if p.is_dir())]
        return sorted(dirs, key=lambda p: -len(p.parts))

    def leftovers(self) -> list[str]:
        """What the node would have left on the host; empty after a clean stop()."""
        found = []
        for hierarchy in self._cgroup_hierarchies():
            if (hierarchy / CGROUP_ROOT).exists():
                found.append(f"cgroup {hierarchy / CGROUP_ROOT}")
        found += [f"netns {ns}" for ns in _netns() - self._netns_before]
        if _run("ip", "link", "show", BRIDGE, check=False).returncode == 0:
            found.append(f"bridge {BRIDGE}")
        if NAT_COMMENT in _run("iptables", "-w", "-t", "nat", "-S", check=False).stdout:
            found.append("DNAT rule")
        mounts = Path("/proc/self/mountinfo").read_text()
        if str(self.workdir) in mounts:
            found.append(f"mounts under {self.workdir}")
        if self.containerd is not None:
            shims = list(self.containerd._our_shims())
            found += [f"shim pid {pid}" for pid, _ in shims]
            found += [f"shim socket {s}" for _, s in shims if s.exists()]
        if self._ip_forward is not None and (
            Path("/proc/sys/net/ipv4/ip_forward").read_text().strip() != self._ip_forward
        ):
            found.append(f"ip_forward is {Path('/proc/sys/net/ipv4/ip_forward').read_text()!r}")
        return found

    # -- helpers for tests -------------------------------------------------------------

    def log(self, name: str, n: int = 60) -> str:
        return self.procs[name].tail(n)


def _netns() -> set[str]:
    d = Path("/run/netns")
    return {p.name for p in d.iterdir()} if d.is_dir() else set()


@contextlib.contextmanager
def running_node(workdir: Path | None = None) -> Iterator[Node]:
    workdir = workdir or Path(tempfile.mkdtemp(prefix="ew-node-"))
    node = Node(workdir)
    try:
        node.start()
        yield node
    finally:
        node.stop()
        if os.environ.get("EXECWATCH_KEEP_NODE") != "1":
            shutil.rmtree(workdir, ignore_errors=True)


def pod_ready(pod: Any) -> bool:
    conds = {c.type: c.status for c in (pod.status.conditions or [])}
    return conds.get("Ready") == "True"


def main() -> None:
    with running_node() as node:
        print(f"node {NODE_NAME} Ready; KUBECONFIG={node.kubeconfig}\nCtrl-C stops and cleans up")
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()


if __name__ == "__main__":
    main()
