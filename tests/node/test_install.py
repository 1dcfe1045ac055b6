"""`helm install` with the chart's defaults plus the CRI socket: agent and handler Ready under
a real kubelet, with exactly the chart's security context as the kernel enforces it."""

from __future__ import annotations

from pathlib import Path

from kubernetes import client

from tests.support.deploy.chart import find, pod_spec, render
from tests.support.kubenode.helm_install import NAMESPACE, Release, agent_pod, node_values
from tests.support.kubenode.kubelet_node import Node

# Capability bits (linux/capability.h).
CAP_BIT = {"DAC_READ_SEARCH": 2, "SYS_PTRACE": 19, "SYS_RESOURCE": 24, "PERFMON": 38, "BPF": 39}


def container_pid(pod: client.V1Pod, container: str) -> int:
    """A host PID of the container's processes, found by its id in /proc/PID/cgroup."""
    (status,) = [s for s in pod.status.container_statuses if s.name == container]
    cid = status.container_id.split("://", 1)[1]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if cid in (entry / "cgroup").read_text():
                    return int(entry.name)
            except OSError:
                continue
    raise AssertionError(f"no process of container {container} ({cid[:12]})")


def proc_status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.strip() for k, _, v in (line.partition(":") for line in lines)}


def caps(mask: str) -> set[str]:
    value = int(mask, 16)
    return {name for name, bit in CAP_BIT.items() if value >> bit & 1} | (
        {"OTHER"} if value & ~sum(1 << b for b in CAP_BIT.values()) else set()
    )


def test_install_needs_only_the_cri_socket_and_prints_notes(node: Node, release: Release) -> None:
    assert release.values == node_values(node)
    assert "kubectl -n execwatch get daemonset,deployment,pods" in release.notes
    assert "execwatch.io/exec-failure" in release.notes


def test_namespace_enforces_pod_security_as_documented(node: Node, release: Release) -> None:
    ns = node.core().read_namespace(NAMESPACE)
    assert ns.metadata.labels["pod-security.kubernetes.io/enforce"] == "privileged"
    assert ns.metadata.labels["pod-security.kubernetes.io/audit"] == "baseline"


def test_agent_runs_with_exactly_the_charts_privileges(node: Node, release: Release) -> None:
    chart = pod_spec(find(render(*node_values(node)), "DaemonSet"))
    pod = agent_pod(node)
    ctr = pod.spec.containers[0]
    want = chart["containers"][0]["securityContext"]
    assert sorted(ctr.security_context.capabilities.add) == sorted(want["capabilities"]["add"])
    assert pod.spec.host_pid and not pod.spec.host_network

    status = proc_status(container_pid(pod, "agent"))
    assert status["Uid"].split()[0] == "0"
    # The kernel's view: exactly the added capabilities, nothing else; no_new_privs; seccomp.
    assert caps(status["CapEff"]) == set(want["capabilities"]["add"])
    assert status["NoNewPrivs"] == "1"
    assert status["Seccomp"] == "2"  # filter mode: RuntimeDefault is in force


def test_agent_host_mounts_are_read_only(node: Node, release: Release) -> None:
    pid = container_pid(agent_pod(node), "agent")
    mounts = {}
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        fields = line.split()
        mounts[fields[4]] = fields[5].split(",")
    for path in ("/sys/kernel/tracing", "/sys/kernel/btf", "/sys/fs/cgroup", "/"):
        assert "ro" in mounts[path], (path, mounts[path])
    assert node.containerd is not None
    assert "ro" in mounts[str(node.containerd.socket)]


def test_handler_runs_unprivileged(node: Node, release: Release) -> None:
    pods = node.core().list_namespaced_pod(
        NAMESPACE, label_selector="app.kubernetes.io/component=handler"
    )
    assert len(pods.items) == 2
    for pod in pods.items:
        status = proc_status(container_pid(pod, "handler"))
        assert status["Uid"].split()[0] == "65532"
        assert int(status["CapEff"], 16) == 0
        assert status["NoNewPrivs"] == "1"
        assert status["Seccomp"] == "2"
