"""No namespace stalls another's placement, against the real API server and registry.

A slow-loris registry on loopback drips one byte every half second, so a request to it
never ends on its own (its timeout is per read). Pods of one enforce namespace whose
images name it hold the workers that take them. Work is handed out round-robin over
namespaces, one namespace holds at most `workers` of the pool's workers and the pool has
an eighth more, so a pod of another namespace is still decided within its budget; and a
reaper ungates, unchanged, every pod past its budget plus grace, whatever its worker
waits on."""

from __future__ import annotations

import ipaddress
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from prometheus_client import CollectorRegistry, Counter

from execwatch.kube.lease import LeaseConfig
from execwatch.placement.controller import Placer, VerdictSource
from execwatch.placement.decision import ContainerVerdict
from execwatch.placement.pullsecrets import PullSecrets
from execwatch.placement.run import ControllerConfig, PlacementController
from execwatch.placement.scanned import ScannedVerdicts
from execwatch.placement.webhook import GATE, GATED_LABEL, GATED_VALUE
from execwatch.runnable.limits import Limits
from execwatch.scan.egress import Egress
from execwatch.scan.registry import RegistryOptions
from tests.placement.cluster import create_pod, gates, namespace, rest_for
from tests.placement.drip import DripRegistry, drip_registry
from tests.placement.test_controller import Seen, events, stored
from tests.placement.test_scanned import ARCHES, enforced
from tests.support.registry.registry_server import Registry
from tests.support.wait import wait_until

BUDGET = 30.0


@pytest.fixture
def drip() -> Iterator[DripRegistry]:
    with drip_registry() as made:
        yield made


def controller(
    admin: client.ApiClient,
    registry: Registry,
    drip: DripRegistry,
    tmp: Path,
    config: dict[str, Any],
    budget: float = BUDGET,
    source: VerdictSource | None = None,
) -> PlacementController:
    """The controller with the scan engine, for the real registry and the dripping one
    (or with `source`)."""
    rest = rest_for(admin)
    options = RegistryOptions(
        ca_file=str(registry.ca),
        insecure=frozenset({drip.host}),
        cache_dir=str(tmp / "cache"),
        egress=Egress((ipaddress.ip_network("127.0.0.0/8"),)),  # both registries on loopback
    )
    if source is None:
        source = ScannedVerdicts(PullSecrets(rest), options, Limits(), lambda: ARCHES)
    placer = Placer(rest, source, lambda: ARCHES, Seen(), budget=budget)
    lease = LeaseConfig(
        namespace="execwatch", name=f"placement-{uuid.uuid4().hex[:6]}", identity="fair",
        lease_duration=3, renew_deadline=2, retry_period=0.5, request_timeout=1,
    )  # fmt: skip
    errors = Counter("e", "e", ["verb", "code"], registry=CollectorRegistry())
    return PlacementController(ControllerConfig(lease, **config), placer, errors)


@pytest.fixture
def running(drip: DripRegistry) -> Iterator[list[PlacementController]]:
    made: list[PlacementController] = []
    yield made
    drip.stop()  # first: the workers it holds return
    for c in made:
        c.stop()
        c.placer.rest.close()


def slow_pods(admin: client.ApiClient, drip: DripRegistry, n: int) -> list[dict[str, Any]]:
    """`n` pods, gated by the webhook, in one enforce namespace, of images on the drip."""
    ns = namespace(admin, "enforce", prefix="slow")
    app = {"name": "app", "image": f"{drip.host}/team/slow:1"}
    return [
        create_pod(admin, ns, metadata={"name": f"slow-{i}"}, containers=[app]) for i in range(n)
    ]


def decided(admin: client.ApiClient, pod: dict[str, Any]) -> list[tuple[str, str, str]]:
    now = stored(admin, pod)
    return events(admin, now) if gates(now) == [] else []


def test_sixteen_pods_on_a_dripping_registry_do_not_delay_another_namespaces_pod(
    registered: object,
    admin: client.ApiClient,
    registry: Registry,
    pushed: dict[str, str],
    drip: DripRegistry,
    running: list[PlacementController],
    tmp_path: Path,
) -> None:
    slow = slow_pods(admin, drip, 16)
    c = controller(admin, registry, drip, tmp_path, {"workers": 16})
    running.append(c)
    c.start()
    wait_until(lambda: drip.holding() >= 16, timeout=30)  # as many workers as they may hold

    ns, secrets = enforced(admin, registry)
    app = {"name": "app", "image": pushed["hello"]}
    victim = create_pod(admin, ns, imagePullSecrets=secrets, containers=[app])
    created = time.monotonic()
    wait_until(lambda: decided(admin, victim), timeout=BUDGET)

    took = time.monotonic() - created
    [(kind, reason, note)] = decided(admin, victim)
    assert (kind, reason) == ("Normal", "PlacementUnchanged"), note  # judged, not failed open
    assert took < BUDGET
    assert all(gates(stored(admin, p)) == [GATE] for p in slow), "still on the drip"
    assert drip.holding() >= 16


class Stuck:
    """A verdict source whose calls return only when released: a worker stuck past every
    deadline the registry client has (the reaper's case, whatever the worker waits on)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self._lock = threading.Lock()
        self.holding = 0

    def judge(
        self, pod: Mapping[str, Any], container: Mapping[str, Any], deadline: float
    ) -> ContainerVerdict:
        with self._lock:
            self.holding += 1
        self.release.wait()
        return ContainerVerdict(str(container.get("name")), str(container.get("image")), {})


def test_the_reaper_ungates_pods_past_budget_whatever_their_workers_wait_on(
    registered: object,
    admin: client.ApiClient,
    registry: Registry,
    drip: DripRegistry,
    running: list[PlacementController],
    tmp_path: Path,
) -> None:
    budget, grace = 4.0, 1.0
    stuck = Stuck()
    slow = slow_pods(admin, drip, 3)
    config = {"workers": 4, "grace": grace}
    c = controller(admin, registry, drip, tmp_path, config, budget, source=stuck)
    running.append(c)
    c.start()
    try:
        wait_until(lambda: all(decided(admin, p) for p in slow), timeout=budget + grace + 10)

        for pod in slow:
            now = stored(admin, pod)
            assert not now["spec"].get("affinity")
            [(kind, reason, note)] = events(admin, now)
            assert (kind, reason) == ("Warning", "PlacementSkipped")
            assert note == "placed without a verdict: no verdict within 4 s of the pod's creation"
        assert stuck.holding == 3, "the workers are still stuck"
    finally:
        stuck.release.set()


def at_once(placer: Placer, pod: dict[str, Any]) -> list[object]:
    """What `placer.handle` returned within 10 s (nothing, if it still waits)."""
    handled: list[object] = []
    judge = threading.Thread(target=lambda: handled.append(placer.handle(pod)), daemon=True)
    judge.start()
    judge.join(timeout=10)
    return handled


def test_a_pod_that_gated_itself_outside_an_opted_in_namespace_is_left_alone(
    admin: client.ApiClient,
    registry: Registry,
    drip: DripRegistry,
    tmp_path: Path,
) -> None:
    c = controller(admin, registry, drip, tmp_path, {})
    app = {"name": "app", "image": f"{drip.host}/team/slow:1"}
    own = {"name": "self", "labels": {GATED_LABEL: GATED_VALUE}}
    for ns in (
        namespace(admin, None),
        namespace(admin, "warn"),
        namespace(admin, "enforce", prefix="kube-team"),
    ):
        gate = [{"name": GATE}]
        pod = create_pod(admin, ns, metadata=own, schedulingGates=gate, containers=[app])
        assert at_once(c.placer, pod) == [None], "left alone at once, not judged"
        now = stored(admin, pod)
        assert gates(now) == [GATE] and events(admin, now) == []
    assert drip.holding() == 0, "never judged: its registry was never asked"
    c.placer.rest.close()
