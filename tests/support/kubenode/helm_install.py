"""`helm install` of the chart on the test node, exactly as docs/install.md tells users."""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from typing import Any

import yaml
from kubernetes import client

from tests.support.deploy.chart import CHART, helm
from tests.support.kubenode.kubelet_node import QUOTA_RESYNC, Node, pod_ready, wait_for

NAMESPACE = "execwatch"
RELEASE = "execwatch"
QUOTA, COUNTED = "execwatch-records", "count/execfailures.execwatch.io"


@dataclass
class Release:
    values: list[str]  # the --set flags, all of them
    seconds_to_ready: float  # `helm install` started -> every agent and handler pod Ready
    notes: str


def node_root_pid() -> int:
    """A process whose root and mount namespace are the node's: init, as on any node,
    unless init is a supervisor nobody may open (this sandbox's PID 1); then this test
    process, which runs in the node's mount namespace beside the kubelet and containerd."""
    try:
        os.listdir("/proc/1/root")
    except OSError:
        return os.getpid()
    return 1


def node_values(node: Node) -> list[str]:
    """What this node needs beyond the chart's defaults: its containerd's CRI socket, and
    where the agent finds the node's root."""
    assert node.containerd is not None
    return [
        f"agent.criSocket={node.containerd.socket}",
        f"agent.hostRoot=/proc/{node_root_pid()}/root",
    ]


def run_helm(node: Node, *args: str, timeout: float = 300) -> str:
    env = {
        **os.environ,
        "KUBECONFIG": str(node.kubeconfig),
        "HELM_CACHE_HOME": str(node.workdir / "helm" / "cache"),
        "HELM_CONFIG_HOME": str(node.workdir / "helm" / "config"),
        "HELM_DATA_HOME": str(node.workdir / "helm" / "data"),
    }
    out = subprocess.run(
        [str(helm()), *args], env=env, capture_output=True, text=True, timeout=timeout
    )
    if out.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{out.stdout}\n{out.stderr}")
    return out.stdout


def pod_security_labels() -> dict[str, str]:
    """The labels docs/install.md puts on the namespace: the chart's namespace.podSecurity."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    levels = values["namespace"]["podSecurity"]
    return {f"pod-security.kubernetes.io/{mode}": lvl for mode, lvl in levels.items() if lvl}


def helm_install(node: Node) -> Release:
    """kubectl create namespace + label, then helm install: docs/install.md's commands."""
    values = node_values(node)
    t0 = time.monotonic()
    node.core().create_namespace(
        client.V1Namespace(
            metadata=client.V1ObjectMeta(name=NAMESPACE, labels=pod_security_labels())
        )
    )
    argv = ["install", RELEASE, str(CHART), "--namespace", NAMESPACE]
    for v in values:
        argv += ["--set", v]
    notes = run_helm(node, *argv)
    wait_workloads_ready(node)
    return Release(values, time.monotonic() - t0, notes)


def wait_workloads_ready(node: Node, timeout: float = 240) -> None:
    """The DaemonSet's pod on the node and both handler replicas Ready, rollouts done."""
    api = node.client()
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)

    def done() -> bool:
        ds = apps.read_namespaced_daemon_set("execwatch-agent", NAMESPACE)
        dep = apps.read_namespaced_deployment("execwatch-handler", NAMESPACE)
        ds_ok = (
            ds.status.observed_generation == ds.metadata.generation
            and ds.status.desired_number_scheduled == 1
            and ds.status.number_ready == 1
            and (ds.status.updated_number_scheduled or 0) == 1
        )
        dep_ok = (
            dep.status.observed_generation == dep.metadata.generation
            and (dep.status.ready_replicas or 0) == 2
            and (dep.status.updated_replicas or 0) == 2
            and (dep.status.replicas or 0) == 2
        )
        return ds_ok and dep_ok

    try:
        wait_for("execwatch agent and handler Ready", done, timeout, every=0.5)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{describe_pods(core, NAMESPACE)}") from None


def describe_pods(core: client.CoreV1Api, namespace: str) -> str:
    """Pod phases, container states and the namespace's Warning events, for failures."""
    lines = []
    for pod in core.list_namespaced_pod(namespace).items:
        states = [
            f"{s.name}: {_state(s.state)} restarts={s.restart_count}"
            for s in pod.status.container_statuses or []
        ]
        lines.append(f"{pod.metadata.name} {pod.status.phase} ready={pod_ready(pod)} {states}")
    for ev in core.list_namespaced_event(namespace).items:
        if ev.type == "Warning":
            lines.append(f"event {ev.involved_object.name}: {ev.reason} {ev.message}")
    return "\n".join(lines)


def _state(state: Any) -> str:
    if state.waiting:
        return f"waiting {state.waiting.reason} {state.waiting.message or ''}"
    if state.terminated:
        t = state.terminated
        return f"terminated {t.reason} exit={t.exit_code} {t.message or ''}"
    return "running"


def agent_pod(node: Node) -> client.V1Pod:
    pods = node.core().list_namespaced_pod(
        NAMESPACE, label_selector="app.kubernetes.io/component=agent"
    )
    (pod,) = [p for p in pods.items if p.metadata.deletion_timestamp is None]
    return pod


def quota_counted(node: Node) -> bool:
    """Whether the controller-manager has counted the chart's records quota (until then
    the API server refuses every record: docs/install.md)."""
    quota = node.core().read_namespaced_resource_quota(QUOTA, NAMESPACE)
    return COUNTED in (quota.status.used or {})


def wait_quota_counted(node: Node) -> None:
    wait_for("the records quota counted", lambda: quota_counted(node), QUOTA_RESYNC + 60, 2)
