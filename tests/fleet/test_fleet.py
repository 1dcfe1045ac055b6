"""A fleet of 100 simulated nodes and 1,000 pods: exact counts and node binding at scale.

The nodes are KWOK's (tests/support/kube/kwok.py), 70 amd64 and 30 arm64, on a real control
plane with the real scheduler and controllers; ten Deployments put one pod on every node
each. On a sample of nodes, failures are published exactly as that node's agent would:
the real publisher, with a token minted through TokenRequest for the agent DaemonSet's pod
on that node. The real handler turns them into metrics; the counts must match what was
caused, workload by workload and node by node, also when the leading handler stops in
the middle of the crash loops and a standby takes over; and a node speaking for another
is refused by the shipped admission policy.

The fleet runs the controller-manager, so the ResourceQuota on records is kept by its
controller as well as by admission: under load a create can be answered 409 Conflict on
the quota object, which created nothing and is retried (`CountingRecords` counts them).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client

from execwatch import crd
from execwatch.agent.publisher import Publisher, PublisherConfig
from execwatch.handler.controller import Handler, HandlerConfig
from execwatch.handler.metrics import HandlerMetrics
from execwatch.record import Reason
from tests.fleet.conftest import NODES, AgentFleet
from tests.support.agent.exec_failures import CountingRecords, exec_failure
from tests.support.kube.apiserver_fixtures import HANDLER_SA
from tests.support.kube.kwok import FLEET_LABEL, TOLERATION
from tests.support.wait import wait_until

NAMESPACE = "shop"
WORKLOADS = tuple(f"app-{i}" for i in range(10))  # each: one pod on every node
SAMPLE = 5  # every 5th node publishes: 14 amd64 and 6 arm64 agents
OTHER_ARCH = {"amd64": "arm64", "arm64": "amd64"}

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


def start_handler(fleet: AgentFleet, identity: str) -> Handler:
    """The real handler, in this process, as the handler's ServiceAccount."""
    cluster = fleet.fleet.cluster
    h = Handler(
        HandlerConfig(identity=identity, lease_duration=4.0, renew_deadline=3.0,
                      retry_period=0.5, retry_initial=0.2, retry_max=2.0),
        cluster.client_config(cluster.service_account_token(*HANDLER_SA)),
        HandlerMetrics(),
    )  # fmt: skip
    h.start()
    return h


@pytest.fixture(scope="module")
def handler(fleet: AgentFleet) -> Iterator[Handler]:
    h = start_handler(fleet, "fleet-1")
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
    sink: CountingRecords

    def close(self) -> None:
        self.publisher.stop(flush_timeout=60)  # a loaded 2-core machine runs 10 processes
        self.api.close()


def agent(fleet: AgentFleet, node: str, speaks_for: str | None = None, **config: Any) -> Agent:
    api = fleet.fleet.cluster.rest(fleet.fleet.agent_token(fleet.agents[node]))
    cfg = PublisherConfig(node=speaks_for or node, backoff_initial=0.05, backoff_max=0.5, **config)
    sink = CountingRecords(api, crd.DEFAULT_NAMESPACE)
    publisher = Publisher(cfg, sink)
    publisher.start()
    return Agent(node, api, publisher, sink)


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


def crash_loops(
    fleet: AgentFleet, shop: Shop, agents: list[Agent], halfway: Callable[[], None] = lambda: None
) -> Counts:
    """On each agent's node a few workloads crash-loop, each a different number of times
    (repeats fold into one record per key within the aggregation window); `halfway` runs
    when half the agents have published. Returns the failures caused, by (workload, node,
    node_arch). The agents are closed: everything they held is published."""
    caused: Counts = collections.Counter()
    arch = {n.name: n.arch for n in fleet.fleet.nodes}
    try:
        for i, a in enumerate(agents):
            if i == len(agents) // 2:
                halfway()
            for j, workload in enumerate(WORKLOADS[i % 3 :: 3]):
                repeats = 1 + (i + j) % 4
                failure = exec_failure(
                    pod=shop.pods[a.node][workload],
                    reason=Reason.FOREIGN_ARCHITECTURE,
                    node_arch=arch[a.node],
                    binary_arch=OTHER_ARCH[arch[a.node]],
                )
                for _ in range(repeats):
                    a.publisher.submit(failure)
                caused[(workload, a.node, arch[a.node])] += repeats
    finally:
        for a in agents:
            a.close()
    assert sum(a.publisher.spooled() for a in agents) == 0
    return caused


def all_handled(fleet: AgentFleet, handlers: list[Handler], total: int) -> bool:
    return sum(sum(counted(h).values()) for h in handlers) >= total and not records(fleet)


def test_every_failure_published_by_the_agents_is_counted_once_per_workload_and_node(
    fleet: AgentFleet, shop: Shop, handler: Handler
) -> None:
    t0 = time.monotonic()
    agents = [agent(fleet, n.name) for n in fleet.fleet.nodes[::SAMPLE]]
    caused = crash_loops(fleet, shop, agents)
    total = sum(caused.values())
    wait_until(
        lambda: all_handled(fleet, [handler], total),
        180,
        step=0.5,
        explain=lambda: left_over(fleet, handler, agents),
    )
    print(f"counted in {time.monotonic() - t0:.1f} s; {left_over(fleet, handler, agents)}")
    wait_until(handler.idle, 10)
    assert counted(handler, "workload", "node", "node_arch") == caused
    by_workload: Counts = collections.Counter()
    for (workload, _, _), n in caused.items():
        by_workload[(workload,)] += n
    assert counted(handler, "workload") == by_workload
    assert len(by_workload) == len(WORKLOADS)
    assert sum(counted(handler, "node_arch").get((a,), 0) for a in ("amd64", "arm64")) == total


def stop_once_busy(h: Handler, before: Counts) -> None:
    """Stop `h` once it has counted some of the failures after `before`: mid-burst."""
    wait_until(lambda: sum(counted(h).values()) > sum(before.values()), 60)
    h.stop()


def test_counts_stay_exact_when_the_leader_stops_in_the_middle_of_the_crash_loops(
    fleet: AgentFleet, shop: Shop, handler: Handler
) -> None:
    """The leader (the module's handler: this test runs last) stops when half the agents
    have published; a standby takes the Lease and handles the rest. Between the two,
    every failure is counted once."""
    wait_until(handler.elector.is_leader, 30)
    before = counted(handler, "workload", "node", "node_arch")
    standby = start_handler(fleet, "fleet-2")
    t0 = time.monotonic()
    try:
        assert not standby.elector.is_leader()
        agents = [agent(fleet, n.name) for n in fleet.fleet.nodes[2::SAMPLE]]
        caused = crash_loops(fleet, shop, agents, halfway=lambda: stop_once_busy(handler, before))
        total = sum(caused.values()) + sum(before.values())
        wait_until(
            lambda: all_handled(fleet, [handler, standby], total),
            180,
            step=0.5,
            explain=lambda: left_over(fleet, standby, agents),
        )
        print(f"counted in {time.monotonic() - t0:.1f} s; {left_over(fleet, standby, agents)}")
        wait_until(standby.idle, 10)
        both = counted(handler, "workload", "node", "node_arch")
        both.update(counted(standby, "workload", "node", "node_arch"))
        assert both - before == caused
        assert sum(both.values()) == total
        assert standby.elector.is_leader()
        assert sum(counted(standby).values()) > 0  # both led while failures came in
    finally:
        standby.stop()


def left_over(fleet: AgentFleet, handler: Handler, agents: list[Agent]) -> str:
    """What is still on its way when the counts do not add up (the failure's message)."""
    now = time.time()
    ages = [
        now - (crd.parse_time(r["metadata"]["creationTimestamp"]) or now) for r in records(fleet)
    ]
    samples = {
        f"{s.name}{sorted(s.labels.values())}": s.value
        for family in handler.metrics.registry.collect()
        for s in family.samples
        if s.name in ("execwatch_handler_api_errors_total", "execwatch_handler_records_total")
    }
    refused = collections.Counter(
        s.labels["code"]
        for a in agents
        for family in a.publisher.metrics.registry.collect()
        for s in family.samples
        if s.name == "execwatch_publisher_api_errors_total"
        for _ in range(int(s.value))
    )
    return (
        f"counted {sum(counted(handler).values())}; records left {len(ages)}"
        f" (oldest {max(ages, default=0.0):.0f} s); queue {len(handler.queue)};"
        f" leader {handler.elector.is_leader()}; idle {handler.idle()};"
        f" spooled {sum(a.publisher.spooled() for a in agents)}; agents' errors {dict(refused)}"
        f" ({sum(a.sink.conflicts for a in agents)} quota conflicts);"
        f" handler {samples}"
    )
