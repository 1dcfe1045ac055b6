"""A fleet of 100 simulated nodes and 1,000 pods: exact counts and node binding at scale.

The nodes are KWOK's (tests/fleet/kwok.py), 70 amd64 and 30 arm64, on a real control
plane with the real scheduler and controllers; ten Deployments put one pod on every node
each. On a sample of nodes, failures are published exactly as that node's agent would:
the real publisher, with a token minted through TokenRequest for the agent DaemonSet's pod
on that node. The real handler turns them into metrics; the counts must match what was
caused, workload by workload and node by node, and a node speaking for another is refused
by the shipped admission policy.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client

from execwatch.cluster import crd
from execwatch.cluster.handler import Handler, HandlerConfig
from execwatch.cluster.kubeapi import RecordApi
from execwatch.cluster.metrics import HandlerMetrics
from execwatch.cluster.publisher import Publisher, PublisherConfig
from tests.cluster.records import exec_failure
from tests.fleet.conftest import NODES, AgentFleet
from tests.fleet.kwok import FLEET_LABEL, TOLERATION
from tests.kube.fixtures import HANDLER_SA
from tests.support.wait import wait_until

NAMESPACE = "shop"
WORKLOADS = tuple(f"app-{i}" for i in range(10))  # each: one pod on every node

Counts = collections.Counter[tuple[str, ...]]


def deployment(name: str) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "metadata": {"name": name},
        "spec": {
            "replicas": NODES,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "tolerations": [TOLERATION],
                    "nodeSelector": {FLEET_LABEL: "true"},
                    "topologySpreadConstraints": [
                        {
                            "maxSkew": 1,
                            "topologyKey": "kubernetes.io/hostname",
                            "whenUnsatisfiable": "DoNotSchedule",
                            "labelSelector": {"matchLabels": labels},
                        }
                    ],
                    "containers": [{"name": "app", "image": "registry.example/app:1"}],
                },
            },
        },
    }


@dataclass
class Shop:
    pods: dict[str, dict[str, Any]]  # node -> workload -> pod (as a dict)


@pytest.fixture(scope="module")
def shop(fleet: AgentFleet) -> Shop:
    """The ten Deployments, all 1,000 pods Running on the kwok nodes."""
    cluster = fleet.fleet.cluster
    with cluster.client() as api:
        client.CoreV1Api(api).create_namespace({"metadata": {"name": NAMESPACE}})
        apps = client.AppsV1Api(api)
        for name in WORKLOADS:
            apps.create_namespaced_deployment(NAMESPACE, deployment(name))
        pods = fleet.fleet.wait_running(NAMESPACE, "app", NODES * len(WORKLOADS))
        by_node: dict[str, dict[str, Any]] = collections.defaultdict(dict)
        for pod in pods:
            by_node[pod.spec.node_name][pod.metadata.labels["app"]] = (
                api.sanitize_for_serialization(pod)
            )
    return Shop(dict(by_node))


@pytest.fixture(scope="module")
def handler(fleet: AgentFleet) -> Iterator[Handler]:
    """The real handler, in this process, as the handler's ServiceAccount."""
    cluster = fleet.fleet.cluster
    with cluster.client(cluster.service_account_token(*HANDLER_SA)) as api:
        h = Handler(
            HandlerConfig(identity="fleet-1", lease_duration=4.0, renew_deadline=3.0,
                          retry_period=0.5, retry_initial=0.2, retry_max=2.0),
            api,
            HandlerMetrics(),
        )  # fmt: skip
        h.start()
        try:
            yield h
        finally:
            h.stop()


def counted(h: Handler, *labels: str) -> Counts:
    """execwatch_exec_failures_total summed by `labels`."""
    out: Counts = collections.Counter()
    for family in h.metrics.registry.collect():
        for s in family.samples:
            if s.name == "execwatch_exec_failures_total":
                out[tuple(s.labels[k] for k in labels)] += int(s.value)
    return out


def records(fleet: AgentFleet) -> list[dict[str, Any]]:
    with fleet.fleet.cluster.client() as api:
        result = client.CustomObjectsApi(api).list_namespaced_custom_object(
            crd.GROUP, crd.VERSION, crd.DEFAULT_NAMESPACE, crd.PLURAL
        )
    items: list[dict[str, Any]] = result["items"]
    return items


@dataclass
class Agent:
    """A node's agent: the real publisher, with the token of the agent pod on that node."""

    node: str
    api: Any
    publisher: Publisher

    def close(self) -> None:
        self.publisher.stop(flush_timeout=60)  # a loaded 2-core machine runs 10 processes
        self.api.close()


def agent(fleet: AgentFleet, node: str, speaks_for: str | None = None, **config: Any) -> Agent:
    api = fleet.fleet.cluster.lightkube(fleet.fleet.agent_token(fleet.agents[node]))
    cfg = PublisherConfig(node=speaks_for or node, backoff_initial=0.05, backoff_max=0.5, **config)
    publisher = Publisher(cfg, RecordApi(api, crd.DEFAULT_NAMESPACE))
    publisher.start()
    return Agent(node, api, publisher)


def test_the_fleet_is_100_nodes_of_two_architectures_and_1000_running_pods(
    fleet: AgentFleet, shop: Shop
) -> None:
    nodes = fleet.fleet.nodes
    assert len(nodes) == NODES
    assert collections.Counter(n.arch for n in nodes) == {"amd64": 70, "arm64": 30}
    with fleet.fleet.cluster.client() as api:
        listed = client.CoreV1Api(api).list_node(label_selector=FLEET_LABEL).items
    assert {n.metadata.name: n.status.node_info.architecture for n in listed} == {
        n.name: n.arch for n in nodes
    }
    # The scheduler spread every Deployment one pod per node; kwok ran them all.
    assert set(shop.pods) == {n.name for n in nodes}
    assert all(set(w) == set(WORKLOADS) for w in shop.pods.values())
    assert set(fleet.agents) == {n.name for n in nodes}


def test_an_agent_speaking_for_another_node_is_refused_at_admission(
    fleet: AgentFleet, shop: Shop, handler: Handler
) -> None:
    """The agent of an amd64 node forges a record for an arm64 node's pod: the API server
    refuses it (403) and the handler never sees it."""
    amd64, arm64 = fleet.fleet.by_arch("amd64")[1].name, fleet.fleet.by_arch("arm64")[1].name
    before = counted(handler, "workload", "node")
    forger = agent(fleet, amd64, speaks_for=arm64, refusal_grace=0.0)
    try:
        forger.publisher.submit(exec_failure(pod=shop.pods[arm64]["app-0"], node_arch="arm64"))
        m = forger.publisher.metrics.registry
        wait_until(
            lambda: m.get_sample_value("execwatch_publisher_dropped_total", {"type": "rejected"}),
            30,
        )
        assert m.get_sample_value("execwatch_publisher_api_errors_total", {"code": "403"}) == 1
        assert m.get_sample_value("execwatch_publisher_published_total") == 0
    finally:
        forger.close()
    assert [r["spec"]["node"] for r in records(fleet)] == []
    assert handler.idle() and counted(handler, "workload", "node") == before
