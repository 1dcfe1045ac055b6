"""Placement on the test node: simulated nodes of both architectures beside the real one,
a registry the controller and the node both know, and the chart's placement turned on.

- `KwokNodes`: kwok (sigs.k8s.io/kwok, tests/support/kube/kwok.py's Stages and flags) against the
  node's API server, with a few tainted Node objects of its own; nothing runs on them, kwok
  only marks their pods Running. The real node stays the only amd64 node that runs things.
- `NodeRegistry`: the CNCF distribution registry of tests/registry, plain HTTP, on the
  node's bridge address, which both the placement controller's pods and the host reach.
- `publish`: an image pushed to that registry with skopeo and imported into the node's
  containerd under the same name and, with `--digests`, the same `repo@sha256:` reference
  a pull would have made, so the kubelet reports the registry's digest in `imageID`. The
  node's containerd cannot pull from this registry itself: for a host that is not loopback
  it speaks only HTTPS with the system's CAs.
- `enable_placement`: `helm upgrade --reuse-values --set placement.enabled=true`;
  `WebhookRoute`: the rule kube-proxy would have written, so that the API server reaches
  the webhook's Service (there is no kube-proxy).
- `take_placement_lease`: the controller's Lease held by the test, so that pods stay gated
  with no controller placing them (test_uninstall: `helm uninstall` ungates them).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import struct
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client

from tests.support.deploy.chart import CHART
from tests.support.images.imagebuild import (
    MEDIA,
    Blobs,
    Image,
    compress,
    directory,
    layer_tar,
    tar_directory,
)
from tests.support.kube.apiserver import Proc, binary_dir, free_port
from tests.support.kube.kwok import SimNode, kwok_argv, node_body, node_ready
from tests.support.kubenode.helm_install import NAMESPACE, RELEASE, run_helm
from tests.support.kubenode.kubelet_node import NAT_COMMENT, NODE_IP, Node, pod_ready, wait_for
from tests.support.registry.registry_server import serve_registry

PLACEMENT = "execwatch-placement"  # the chart's Deployment, Service, webhook and the Lease
GATE = "execwatch.io/verify"  # placement's scheduling gate
WEBHOOK_PORT = 8443  # the chart's placement.webhookPort
WEBHOOK_NAT = f"{NAT_COMMENT}-placement"  # node.leftovers() sees it if it is left behind
ARCH_LABEL = "kubernetes.io/arch"
SIM_NODES = (SimNode("ew-kwok-arm64-a", "arm64"), SimNode("ew-kwok-arm64-b", "arm64"),
             SimNode("ew-kwok-amd64-a", "amd64"))  # fmt: skip
ROOT_DIRS = ("bin", "dev", "proc", "sys", "tmp")
EM_AARCH64 = 183
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"


# -- simulated nodes ---------------------------------------------------------------------


@dataclass
class KwokNodes:
    node: Node
    nodes: Sequence[SimNode] = SIM_NODES
    proc: Proc | None = None

    @property
    def names(self) -> set[str]:
        return {n.name for n in self.nodes}

    def of_arch(self, arch: str) -> set[str]:
        return {n.name for n in self.nodes if n.arch == arch}

    def start(self, timeout: float = 120.0) -> None:
        binary = binary_dir() / "kwok"
        if not binary.exists():
            missing = f"{binary} missing: tests/support/kube/kwok.py says how to build it"
            raise FileNotFoundError(missing)
        self.proc = Proc(
            "kwok", kwok_argv(binary, self.node.kubeconfig), self.node.workdir / "kwok.log"
        )
        self.proc.start()
        core = self.node.core()
        for sim in self.nodes:
            core.create_node(node_body(sim, taint=True))

        def ready() -> bool:
            if self.proc is None or not self.proc.alive():
                raise AssertionError(f"kwok exited:\n{self.proc.tail() if self.proc else ''}")
            listed = core.list_node().items
            return self.names <= {n.metadata.name for n in listed if node_ready(n)}

        wait_for(f"{len(self.nodes)} kwok nodes Ready", ready, timeout, every=1.0)

    def stop(self) -> None:
        """The nodes deleted, then the pods bound to them at once (there is no kubelet to
        finish a graceful delete), then kwok stopped."""
        core = self.node.core()
        for name in self.names:
            with contextlib.suppress(client.ApiException):
                core.delete_node(name)

        def none_left() -> bool:  # a DaemonSet may have placed one as its node went
            left = [
                p for p in core.list_pod_for_all_namespaces().items
                if p.spec.node_name in self.names
            ]  # fmt: skip
            for pod in left:
                with contextlib.suppress(client.ApiException):
                    core.delete_namespaced_pod(
                        pod.metadata.name, pod.metadata.namespace, grace_period_seconds=0
                    )
            return not left

        wait_for("no pod left on the kwok nodes", none_left, 60, every=1.0)
        if self.proc is not None:
            self.proc.stop()


# -- registry ------------------------------------------------------------------------------


@dataclass
class NodeRegistry:
    """distribution's registry over plain HTTP on the node's bridge address, no auth."""

    workdir: Path
    port: int = field(default_factory=free_port)
    proc: Proc | None = None

    @property
    def host(self) -> str:
        return f"{NODE_IP}:{self.port}"

    def start(self, timeout: float = 30.0) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = {
            "version": 0.1,
            "log": {"level": "warn", "accesslog": {"disabled": True}},
            "storage": {"filesystem": {"rootdirectory": str(self.workdir / "data")}},
            "http": {"addr": self.host},
        }
        self.proc = serve_registry(self.workdir, config)
        wait_for(f"the registry on {self.host}", self._up, timeout, every=0.2)

    def _up(self) -> bool:
        assert self.proc is not None
        if not self.proc.alive():
            raise AssertionError(f"registry exited:\n{self.proc.tail()}")
        try:
            with urllib.request.urlopen(f"http://{self.host}/v2/", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def digest(self, repo: str, tag: str) -> str:
        """The digest the registry serves for repo:tag (its Docker-Content-Digest)."""
        accept = ", ".join(
            f"application/vnd.oci.image.{kind}.v1+json" for kind in ("index", "manifest")
        )
        request = urllib.request.Request(
            f"http://{self.host}/v2/{repo}/manifests/{tag}",
            method="HEAD",
            headers={"Accept": accept},
        )
        with urllib.request.urlopen(request, timeout=10) as r:
            return str(r.headers["Docker-Content-Digest"])

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()


# -- images ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Published:
    ref: str  # host/repo:tag, as pods name it
    digest: str  # what the tag resolves to in the registry, and the node's imageID digest


def root_dirs() -> list[Any]:
    return [directory(d) for d in ROOT_DIRS]


def index_layout(root: Path, images: list[Image], name: str) -> Path:
    """An OCI layout of one index of `images` (one per platform), each config listing its
    layers' diff_ids as containerd requires, named `name` for both
    skopeo (the ref.name, its tag) and containerd's import (io.containerd.image.name)."""
    blobs = Blobs(root)
    descs = []
    for image in images:
        layers = [layer_tar(entries) for entries in image.layers]
        config = image.config()
        config["rootfs"]["diff_ids"] = [sha256(layer) for layer in layers]
        manifest = {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": blobs.put_json(config, "application/vnd.oci.image.config.v1+json"),
            "layers": [blobs.put(compress(layer, "gzip"), MEDIA["gzip"]) for layer in layers],
        }
        descs.append({**blobs.put_json(manifest, OCI_MANIFEST), "platform": image.platform()})
    index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": descs}
    top = blobs.put_json(index, OCI_INDEX)
    top["annotations"] = {
        "org.opencontainers.image.ref.name": name.rpartition(":")[2],
        "io.containerd.image.name": name,
    }
    (root / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [top]}))
    (root / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    return root


def publish(
    node: Node, registry: NodeRegistry, repo: str, tag: str, images: list[Image]
) -> Published:
    """`images` (one per platform) as an index, pushed and imported under one name."""
    work = node.workdir / "placement-images" / repo.replace("/", "-")
    base = f"{registry.host}/{repo}"
    ref = f"{base}:{tag}"
    layout = index_layout(work / "layout", images, ref)
    (top,) = json.loads((layout / "index.json").read_text())["manifests"]
    run(
        "skopeo", "copy", "--quiet", "--all", "--preserve-digests", "--dest-tls-verify=false",
        f"oci:{layout}:{tag}", f"docker://{ref}",
    )  # fmt: skip
    served = registry.digest(repo, tag)
    assert served == top["digest"], f"skopeo rewrote the index: {served} != {top['digest']}"
    assert node.containerd is not None
    # --digests also names the image base@digest, as a pull does: the kubelet's imageID.
    run(
        "ctr", "--address", str(node.containerd.socket), "-n", "k8s.io", "images", "import",
        "--snapshotter", "overlayfs", "--base-name", base, "--digests",
        str(tar_directory(layout, work / "image.tar")),
    )  # fmt: skip
    return Published(ref, served)


def run(*argv: str, timeout: float = 300) -> None:
    out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if out.returncode != 0:
        raise AssertionError(f"{' '.join(argv)}: {out.stdout}{out.stderr}")


def aarch64_exit() -> bytes:
    """The smallest static AArch64 program: `exit(0)`, 132 bytes; a ConfigMap holds it."""
    code = struct.pack("<3I", 0xD2800000, 0xD2800BA8, 0xD4000001)  # mov x0,0; mov x8,93; svc 0
    base, size = 0x400000, 64 + 56 + len(code)
    ehdr = struct.pack(
        "<16sHHIQQQIHHHHHH", b"\x7fELF\x02\x01\x01" + bytes(9), 2, EM_AARCH64, 1,
        base + 120, 64, 0, 0, 64, 56, 1, 64, 0, 0,
    )  # fmt: skip
    load = struct.pack("<IIQQQQQQ", 1, 5, 0, base, base, size, size, 0x1000)
    return ehdr + load + code


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


# -- placement on ----------------------------------------------------------------------------


@dataclass
class WebhookRoute:
    """The DNAT rule kube-proxy would have written for the API server's calls to the
    webhook Service (the API server dials the Service's ClusterIP; there is no kube-proxy)."""

    cluster_ip: str = ""
    pod_ip: str = ""

    def _rule(self, op: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["iptables", "-w", "-t", "nat", op, "OUTPUT", "-d", f"{self.cluster_ip}/32", "-p",
             "tcp", "--dport", "443", "-m", "comment", "--comment", WEBHOOK_NAT, "-j", "DNAT",
             "--to-destination", f"{self.pod_ip}:{WEBHOOK_PORT}"],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip

    def add(self, node: Node) -> None:
        core = node.core()
        self.cluster_ip = core.read_namespaced_service(PLACEMENT, NAMESPACE).spec.cluster_ip
        pods = core.list_namespaced_pod(
            NAMESPACE, label_selector="app.kubernetes.io/component=placement"
        ).items
        self.pod_ip = next(p.status.pod_ip for p in pods if pod_ready(p))
        out = self._rule("-A")
        assert out.returncode == 0, out.stderr

    def remove(self) -> None:
        if self.cluster_ip:
            while self._rule("-D").returncode == 0:
                pass


def placement_values(registry: NodeRegistry) -> list[str]:
    """Placement on, the node's registry spoken to over plain HTTP and allowed at its
    private address (every other private destination stays refused)."""
    return [
        "placement.enabled=true",
        f"placement.registry.insecure={{{registry.host}}}",
        f"placement.registry.allowPrivate={{{NODE_IP}/32}}",
    ]


def enable_placement(node: Node, registry: NodeRegistry, timeout: float = 240) -> None:
    """helm upgrade with placement on: the handler rolls (--placement-feedback), the two
    placement replicas become Ready once the leader has written the certificate and the
    kubelet has mounted it, and the webhook configuration carries its CA."""
    argv = ["upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE, "--reuse-values"]
    for value in placement_values(registry):
        argv += ["--set", value]
    run_helm(node, *argv)
    apps = client.AppsV1Api(node.client())

    def handler_rolled() -> bool:  # the agent DaemonSet now also has the kwok nodes
        dep = apps.read_namespaced_deployment("execwatch-handler", NAMESPACE)
        return bool(
            dep.status.observed_generation == dep.metadata.generation
            and (dep.status.ready_replicas or 0) == 2
            and (dep.status.updated_replicas or 0) == 2
            and (dep.status.replicas or 0) == 2
        )

    wait_for("the handler rolled with --placement-feedback", handler_rolled, timeout, every=1.0)
    wait_for(
        "both placement replicas Ready",
        lambda: (
            (apps.read_namespaced_deployment(PLACEMENT, NAMESPACE).status.ready_replicas or 0) == 2
        ),
        timeout,
        every=1.0,
    )
    admission = client.AdmissionregistrationV1Api(node.client())
    wait_for(
        "the webhook configuration's caBundle",
        lambda: all(
            w.client_config.ca_bundle
            for w in admission.read_mutating_webhook_configuration(PLACEMENT).webhooks
        ),
        60,
    )


@contextlib.contextmanager
def placement_on(node: Node) -> Iterator[tuple[KwokNodes, NodeRegistry, WebhookRoute]]:
    registry = NodeRegistry(node.workdir / "placement-registry")
    kwok = KwokNodes(node)
    route = WebhookRoute()
    try:
        registry.start()
        # The controller lists node architectures when it starts: the nodes come first.
        kwok.start()
        enable_placement(node, registry)
        route.add(node)
        yield kwok, registry, route
    finally:
        route.remove()
        kwok.stop()
        registry.stop()


# -- uninstall ---------------------------------------------------------------------------------


def gated(pod: Any) -> bool:
    return any(g.name == GATE for g in pod.spec.scheduling_gates or [])


def take_placement_lease(node: Node, holder: str = "tests.node") -> None:
    """Hold the controller's Lease for an hour as someone else: the leader steps down at
    its renew deadline, and no replica places pods while every one still gates them."""
    t0 = time.monotonic()
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    spec = {"holderIdentity": holder, "leaseDurationSeconds": 3600, "renewTime": now}
    client.CoordinationV1Api(node.client()).patch_namespaced_lease(
        PLACEMENT, NAMESPACE, {"spec": spec}
    )
    core = node.core()

    def stepped_down() -> bool:
        since = int(time.monotonic() - t0) + 2
        pods = core.list_namespaced_pod(
            NAMESPACE, label_selector="app.kubernetes.io/component=placement"
        ).items
        return any(
            "lost leadership"
            in core.read_namespaced_pod_log(p.metadata.name, NAMESPACE, since_seconds=since)
            for p in pods
        )

    wait_for("the placement leader stepped down", stepped_down, 60, every=1.0)
