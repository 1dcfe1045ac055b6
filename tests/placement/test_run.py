"""The controller process: leader-elected, it places every gated pod, including those a
previous leader left gated."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client
from prometheus_client import CollectorRegistry, Counter

from execwatch.cluster.lease import LeaseConfig
from execwatch.cluster.rest import Rest
from execwatch.placement.controller import Placer
from execwatch.placement.run import ControllerConfig, PlacementController
from execwatch.placement.webhook import GATE
from tests.kube.cluster import KubeCluster
from tests.placement.cluster import create_pod, gates, namespace
from tests.placement.test_controller import F, R, Scripted, Seen, events, stored
from tests.support.wait import wait_until


def controller(kube: KubeCluster, identity: str, source: Scripted) -> PlacementController:
    api = kube.client()
    placer = Placer(Rest(api), source, lambda: ("amd64", "arm64"), Seen())
    errors = Counter("e", "e", ["verb", "code"], registry=CollectorRegistry())
    lease = LeaseConfig(
        namespace="execwatch", name="execwatch-placement", identity=identity,
        lease_duration=3, renew_deadline=2, retry_period=0.5, request_timeout=1,
    )  # fmt: skip
    cfg = ControllerConfig(lease)
    return PlacementController(cfg, api, placer, errors)


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
