"""A simulated fleet on the tests' real control plane: KWOK nodes of both architectures.

tests/support/kube/apiserver.py runs etcd and kube-apiserver; this adds kube-controller-manager and
kube-scheduler (started as tests/node starts them) and `kwok` (sigs.k8s.io/kwok), run out
of cluster with the Stages of kwok_stages.yaml. The nodes are ordinary Node objects created
here, labelled `kubernetes.io/arch` (a share of them arm64, the rest amd64) and annotated
so that this kwok, and no other, manages them. Pods are scheduled onto them by the real
scheduler, created by the real controllers (Deployments, DaemonSets), and moved to
Running by kwok. Nothing runs: a failure on a node is published by the test, speaking as
that node's agent with a token bound to the agent pod on that node (`agent_token`).

`running_fleet(cluster, workdir, nodes)` is the context manager the fleet test, the
fleet benchmark and the placement tests share; tests/node/placement.py runs `kwok_argv`
with a few nodes beside the real node of tests/node; `python -m tests.support.kube.kwok N` starts a
control plane with N nodes and keeps it until Ctrl-C.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client

from tests.support.kube.apiserver import (
    ADMIN_TOKEN,
    KubeCluster,
    Proc,
    binary_dir,
    load_manifests,
    running_cluster,
)
from tests.support.kubenode.kubelet_node import COMPONENTS, controller_argvs, wait_for

KWOK_VERSION = "v0.8.0"
STAGES = Path(__file__).with_name("kwok_stages.yaml")
MANAGED = ("kwok.x-k8s.io/node", "fake")  # the annotation kwok selects, and the taint
TOLERATION = {"key": MANAGED[0], "operator": "Exists", "effect": "NoSchedule"}
ARCH_LABEL = "kubernetes.io/arch"
FLEET_LABEL = "execwatch.io/fleet"
SERVICE_RANGE = "10.96.0.0/24"  # tests/support/kube/apiserver.py's --service-cluster-ip-range
AGENT = ("execwatch", "execwatch-agent")  # namespace, ServiceAccount (deploy/base)
AGENT_APP = "execwatch-agent-fleet"
API_QPS = ("--kube-api-qps=300", "--kube-api-burst=600")  # the defaults (20, 50) crawl


def build_command() -> str:
    return (
        f"CGO_ENABLED=0 GOFLAGS=-mod=mod GOBIN={binary_dir()} "
        f"go install sigs.k8s.io/kwok/cmd/kwok@{KWOK_VERSION}"
    )


class FleetError(RuntimeError):
    pass


def find_fleet_binaries() -> dict[str, Path]:
    """kwok and the control plane's binaries, or an error saying how to build them."""
    d = binary_dir()
    found = {name: d / name for name in (*COMPONENTS, "kwok") if name != "kubelet"}
    missing = [str(p) for p in found.values() if not os.access(p, os.X_OK)]
    if missing:
        raise FleetError(
            f"missing {', '.join(missing)}: dev/k8s-tools.sh builds the Kubernetes binaries; "
            f"kwok: `{build_command()}`"
        )
    return found


@dataclass(frozen=True)
class SimNode:
    name: str
    arch: str


def plan_nodes(count: int, arm64_share: float = 0.3, prefix: str = "kwok") -> list[SimNode]:
    """`count` nodes, floor(count * arm64_share) of them arm64, spread evenly."""
    return [
        SimNode(
            f"{prefix}-{i:04d}",
            "arm64" if math.floor((i + 1) * arm64_share) > math.floor(i * arm64_share) else "amd64",
        )
        for i in range(count)
    ]


def node_body(node: SimNode, taint: bool) -> dict[str, Any]:
    spec = {"taints": [{"key": MANAGED[0], "value": MANAGED[1], "effect": "NoSchedule"}]}
    return {
        "metadata": {
            "name": node.name,
            "annotations": {MANAGED[0]: MANAGED[1]},
            "labels": {
                ARCH_LABEL: node.arch,
                "kubernetes.io/os": "linux",
                "kubernetes.io/hostname": node.name,
                "type": "kwok",
                FLEET_LABEL: "true",
            },
        },
        "spec": spec if taint else {},
    }


def kwok_argv(binary: Path, kubeconfig: Path) -> list[str]:
    """kwok against the API server of `kubeconfig`, managing only the nodes annotated
    MANAGED, with the Stages of kwok_stages.yaml."""
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        "--manage-all-nodes=false",
        f"--manage-nodes-with-annotation-selector={MANAGED[0]}={MANAGED[1]}",
        f"--config={STAGES}",
        # A Lease per node, renewed every 10 s, as kubelets do (none without the flag).
        "--node-lease-duration-seconds=40",
    ]


def node_ready(node: Any) -> bool:
    conds = {c.type: c.status for c in node.status.conditions or []}
    # The lifecycle controller lifts its not-ready taint a moment after Ready.
    taints = {t.key for t in node.spec.taints or []}
    return conds.get("Ready") == "True" and not any(
        k.startswith("node.kubernetes.io/") for k in taints
    )


@dataclass
class Fleet:
    """kube-controller-manager, kube-scheduler and kwok on `cluster`, and its nodes."""

    cluster: KubeCluster
    workdir: Path
    bins: dict[str, Path] = field(default_factory=find_fleet_binaries)
    nodes: list[SimNode] = field(default_factory=list)
    procs: dict[str, Proc] = field(default_factory=dict)

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        kubeconfig = self.cluster.kubeconfig(ADMIN_TOKEN, self.workdir / "admin.kubeconfig")
        argvs = controller_argvs(
            self.bins,
            kubeconfig,
            self.cluster.ca.parent,
            self.workdir,
            SERVICE_RANGE,
            controller_manager_args=API_QPS,
            scheduler_args=API_QPS,
        )
        argvs["kwok"] = kwok_argv(self.bins["kwok"], kubeconfig)
        for name, argv in argvs.items():
            self.procs[name] = Proc(name, argv, self.workdir / f"{name}.log")
            self.procs[name].start()

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if not proc.alive():
                raise FleetError(f"{name} exited:\n{proc.tail()}")

    def stop(self) -> None:
        for name in reversed(list(self.procs)):
            self.procs[name].stop()

    # -- nodes ---------------------------------------------------------------------------

    def add_nodes(self, nodes: Sequence[SimNode], taint: bool = True) -> None:
        with self.cluster.client() as api:
            core = client.CoreV1Api(api)
            for node in nodes:
                core.create_node(node_body(node, taint))
        self.nodes.extend(nodes)

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Every node of the fleet Ready and schedulable."""
        names = {n.name for n in self.nodes}

        def ready() -> bool:
            self.check_alive()
            with self.cluster.client() as api:
                listed = client.CoreV1Api(api).list_node(label_selector=FLEET_LABEL).items
            return names <= {n.metadata.name for n in listed if node_ready(n)}

        wait_for(f"{len(names)} kwok nodes Ready", ready, timeout, every=1.0)

    def by_arch(self, arch: str) -> list[SimNode]:
        return [n for n in self.nodes if n.arch == arch]

    # -- pods ----------------------------------------------------------------------------

    def running(self, namespace: str, selector: str) -> list[Any]:
        """The Running pods of `namespace` matching the label `selector`."""
        with self.cluster.client() as api:
            pods = client.CoreV1Api(api).list_namespaced_pod(
                namespace, label_selector=selector, field_selector="status.phase=Running"
            )
        return list(pods.items)

    def wait_running(
        self, namespace: str, selector: str, count: int, timeout: float = 180.0
    ) -> list[Any]:
        def enough() -> list[Any] | None:
            self.check_alive()
            pods = self.running(namespace, selector)
            return pods if len(pods) >= count else None

        return wait_for(f"{count} pods {selector} Running", enough, timeout, every=1.0)

    def wait_ready_replicas(self, namespace: str, count: int, timeout: float) -> int:
        """Until the Deployments of `namespace` have `count` ready pods in all: their
        status says it, where listing thousands of pods would cost seconds a poll."""

        def enough() -> int | None:
            self.check_alive()
            with self.cluster.client() as api:
                listed = client.AppsV1Api(api).list_namespaced_deployment(namespace).items
            ready = sum(d.status.ready_replicas or 0 for d in listed)
            return ready if ready >= count else None

        return wait_for(f"{count} ready pods in {namespace}", enough, timeout, every=2.0)

    def deploy_agents(self, timeout: float = 180.0) -> dict[str, Any]:
        """A DaemonSet of the agent's ServiceAccount with a Running pod on every node;
        returns its pods by node (nothing runs in them: `agent_token` speaks for them)."""
        ns, sa = AGENT
        labels = {"app": AGENT_APP}
        with self.cluster.client() as api:
            client.AppsV1Api(api).create_namespaced_daemon_set(
                ns,
                {
                    "metadata": {"name": AGENT_APP},
                    "spec": {
                        "selector": {"matchLabels": labels},
                        "template": {
                            "metadata": {"labels": labels},
                            "spec": {
                                "serviceAccountName": sa,
                                "tolerations": [TOLERATION],
                                "nodeSelector": {FLEET_LABEL: "true"},
                                "containers": [{"name": "agent", "image": "execwatch:fleet"}],
                            },
                        },
                    },
                },
            )
        pods = self.wait_running(ns, f"app={AGENT_APP}", len(self.nodes), timeout)
        return {p.spec.node_name: p for p in pods}

    def agent_token(self, pod: Any, seconds: int = 3600) -> str:
        """A token of the agent's ServiceAccount bound to `pod` (an agent pod), as the
        kubelet mounts it: the API server knows the caller's node from it."""
        with self.cluster.client() as api:
            req = client.AuthenticationV1TokenRequest(
                spec=client.V1TokenRequestSpec(
                    audiences=["https://kubernetes.default.svc"],
                    expiration_seconds=seconds,
                    bound_object_ref=client.V1BoundObjectReference(
                        api_version="v1", kind="Pod", name=pod.metadata.name, uid=pod.metadata.uid
                    ),
                )
            )
            resp = client.CoreV1Api(api).create_namespaced_service_account_token(
                AGENT[1], AGENT[0], req
            )
        token: str = resp.status.token
        return token


@contextlib.contextmanager
def running_fleet(
    cluster: KubeCluster,
    workdir: Path,
    nodes: int,
    arm64_share: float = 0.3,
    taint: bool = True,
    ready_timeout: float = 120.0,
) -> Iterator[Fleet]:
    """`nodes` Ready kwok nodes (a share arm64) on `cluster`, with the controllers and
    scheduler that make Deployments and DaemonSets work on them."""
    fleet = Fleet(cluster, workdir)
    try:
        fleet.start()
        fleet.add_nodes(plan_nodes(nodes, arm64_share), taint)
        fleet.wait_ready(ready_timeout)
        yield fleet
    finally:
        fleet.stop()


@contextlib.contextmanager
def fleet_cluster(workdir: Path, nodes: int, arm64_share: float = 0.3) -> Iterator[Fleet]:
    """A control plane of its own with deploy/base applied, and the fleet on it; `workdir`
    is removed afterwards (kept with EXECWATCH_KEEP_KUBE=1)."""
    try:
        with running_cluster(workdir / "kube") as cluster:
            cluster.apply(load_manifests())
            with running_fleet(cluster, workdir / "fleet", nodes, arm64_share) as fleet:
                yield fleet
    finally:
        if os.environ.get("EXECWATCH_KEEP_KUBE") != "1":
            shutil.rmtree(workdir, ignore_errors=True)


def main(argv: Sequence[str]) -> int:
    try:
        count = int(argv[0]) if argv else 100
    except ValueError:
        print(
            f"usage: python -m tests.support.kube.kwok [NODES]; not a number: {argv[0]!r}",
            file=sys.stderr,
        )
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="ew-fleet-"))
    with fleet_cluster(workdir, count) as fleet:
        path = fleet.cluster.kubeconfig(ADMIN_TOKEN, workdir / "kubeconfig")
        print(f"{count} kwok nodes Ready; KUBECONFIG={path}\nCtrl-C stops and cleans up")
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
