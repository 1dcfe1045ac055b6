"""The controller process: leader-elected, it places every gated pod, including those a
previous leader left gated, and ungates every one when placement is removed."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry, Counter

from execwatch.kube.client import Rest
from execwatch.kube.lease import LeaseConfig
from execwatch.placement.affinity import ARCH_LABEL
from execwatch.placement.controller import Placer
from execwatch.placement.run import ControllerConfig, NodeArches, PlacementController
from execwatch.placement.webhook import GATE
from tests.placement.cluster import create_pod, gates, namespace
from tests.placement.test_controller import F, R, Scripted, Seen, events, stored
from tests.support.kube.apiserver import ADMIN_TOKEN, KubeCluster
from tests.support.wait import wait_until


def controller(kube: KubeCluster, identity: str, source: Scripted) -> PlacementController:
    rest = Rest(kube.client_config(ADMIN_TOKEN))
    placer = Placer(rest, source, lambda: ("amd64", "arm64"), Seen())
    errors = Counter("e", "e", ["verb", "code"], registry=CollectorRegistry())
    lease = LeaseConfig(
        namespace="execwatch", name="execwatch-placement", identity=identity,
        lease_duration=3, renew_deadline=2, retry_period=0.5, request_timeout=1,
    )  # fmt: skip
    cfg = ControllerConfig(lease)
    return PlacementController(cfg, placer, errors)


@pytest.fixture
def source() -> Scripted:
    return Scripted(by_image={"r.example/app:1": (R, F)})


@pytest.fixture
def pair(kube: KubeCluster, source: Scripted) -> Iterator[list[PlacementController]]:
    made = [controller(kube, name, source) for name in ("placement-a", "placement-b")]
    try:
        yield made
    finally:
        for c in made:
            c.stop()
            c.placer.rest.close()


def test_a_new_leader_places_what_was_left_gated_and_each_pod_once(
    registered: object,
    admin: client.ApiClient,
    pair: list[PlacementController],
) -> None:
    ns = namespace(admin, "enforce")
    left = [create_pod(admin, ns, metadata={"name": f"left-{i}"}) for i in range(3)]
    assert all(gates(p) == [GATE] for p in left)

    for c in pair:
        c.start()
    wait_until(lambda: all(gates(stored(admin, p)) == [] for p in left), timeout=30)
    later = create_pod(admin, ns, metadata={"name": "later"})
    wait_until(lambda: gates(stored(admin, later)) == [], timeout=30)

    for pod in [*left, later]:
        assert [r for _, r, _ in events(admin, stored(admin, pod))] == ["Placed"]
    assert sum(c.elector.is_leader() for c in pair) == 1


def test_the_standby_takes_over_when_the_leader_stops(
    registered: object,
    admin: client.ApiClient,
    pair: list[PlacementController],
) -> None:
    first, second = pair
    first.start()
    wait_until(first.elector.is_leader)
    second.start()
    first.stop()

    pod = create_pod(admin, namespace(admin, "enforce"))

    wait_until(lambda: gates(stored(admin, pod)) == [], timeout=30)
    assert second.elector.is_leader()


def test_every_gated_pod_is_ungated_unchanged_when_placement_is_removed(
    registered: object,
    kube: KubeCluster,
    admin: client.ApiClient,
    source: Scripted,
) -> None:
    ns = namespace(admin, "enforce")
    left = [create_pod(admin, ns, metadata={"name": f"left-{i}"}) for i in range(3)]
    free = create_pod(admin, namespace(admin, None))
    assert all(gates(p) == [GATE] for p in left) and gates(free) == []
    c = controller(kube, "placement-last", source)

    assert c.ungate_all("placement is being removed") >= 3  # and any left by other tests
    c.placer.rest.close()

    for pod in left:
        now = stored(admin, pod)
        assert gates(now) == [] and not now["spec"].get("affinity")
        [(kind, reason, note)] = events(admin, now)
        assert (kind, reason) == ("Warning", "PlacementSkipped")
        assert note == "placed without a verdict: placement is being removed"
    assert events(admin, stored(admin, free)) == []


def test_the_architectures_are_those_the_nodes_carry_listed_at_most_once_per_ttl(
    admin: client.ApiClient, rest: Rest
) -> None:
    core = client.CoreV1Api(admin)
    names = {"arches-a": "s390x", "arches-b": "ppc64le", "arches-c": "ppc64le"}
    for name, arch in names.items():
        core.create_node({"metadata": {"name": name, "labels": {ARCH_LABEL: arch}}})
    core.create_node({"metadata": {"name": "arches-unlabelled"}})
    clock = [0.0]
    arches = NodeArches(rest, ttl=60, clock=lambda: clock[0])
    try:
        seen = arches()
        assert {"s390x", "ppc64le"} <= set(seen) and len(seen) == len(set(seen))
        core.delete_node("arches-a")
        assert "s390x" in arches(), "listed again before its ttl"
        clock[0] = 60.0
        assert "s390x" not in arches()
    finally:
        for name in [*names, "arches-unlabelled"]:
            with contextlib.suppress(ApiException):
                core.delete_node(name)
