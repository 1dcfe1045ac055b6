"""The node itself: the versions that work together here, Ready, schedulable, pods on a bridge."""

from __future__ import annotations

import ipaddress

from kubernetes import client

from tests.support.kubenode.kubelet_node import NODE_NAME, POD_SUBNET, Node, pod_ready, wait_for


def test_node_is_ready_and_schedulable_with_the_pinned_versions(node: Node) -> None:
    n = node.core().read_node(NODE_NAME)
    info = n.status.node_info
    assert info.kubelet_version == "v1.35.4"
    assert info.container_runtime_version.startswith("containerd://1.6.")
    assert not n.spec.unschedulable and not n.spec.taints
    conds = {c.type: c.status for c in n.status.conditions}
    assert conds["Ready"] == "True"
    version = client.VersionApi(node.client()).get_code()
    assert version.git_version == "v1.35.4"


def test_a_pod_runs_on_the_bridge(node: Node) -> None:
    core = node.core()
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name="hello", namespace="default"),
        spec=client.V1PodSpec(
            containers=[
                client.V1Container(
                    name="hello",
                    image="docker.io/execwatch-test/web:v1",
                    image_pull_policy="Never",
                )
            ]
        ),
    )
    core.create_namespaced_pod("default", pod)
    try:
        running = wait_for(
            "pod hello Ready",
            lambda: (p := core.read_namespaced_pod("hello", "default")) and pod_ready(p) and p,
            90,
        )
        assert ipaddress.ip_address(running.status.pod_ip) in ipaddress.ip_network(POD_SUBNET)
        assert running.spec.node_name == NODE_NAME
    finally:
        core.delete_namespaced_pod("hello", "default", grace_period_seconds=0)
