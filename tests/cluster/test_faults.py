"""Faults: the handler's leader killed, the API server restarted under a live watch.

Handler replicas run as separate processes (`python -m execwatch.cli handler`)
with the handler ServiceAccount's token, so they can be frozen and killed like pods.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client

from execwatch import crd
from execwatch.agent.publisher import Publisher, PublisherConfig
from execwatch.agent.records import RecordApi
from execwatch.handler.controller import Handler
from tests.cluster.conftest import NODE, PodFactory, list_records, publish
from tests.cluster.test_handler import events_of, failures_total
from tests.support.agent.exec_failures import exec_failure
from tests.support.kube.apiserver import KubeCluster
from tests.support.kube.apiserver_fixtures import AGENT_SA, HANDLER_SA
from tests.support.kube.execwatch_process import ExecwatchProcess
from tests.support.wait import wait_until

LEASE_DURATION = 4.0


class Replica(ExecwatchProcess):
    """One handler replica with a short Lease, so failover tests run in seconds."""

    def __init__(self, identity: str, kubeconfig: Path, log: Path) -> None:
        self.identity = identity
        super().__init__(
            [
                "handler",
                "--kubeconfig",
                str(kubeconfig),
                "--identity",
                identity,
                "--lease-duration",
                str(LEASE_DURATION),
                "--renew-deadline",
                "3",
                "--retry-period",
                "0.5",
            ],
            log,
        )


@pytest.fixture
def replicas(kube: KubeCluster, tmp_path: Path) -> Iterator[Callable[[str], Replica]]:
    token = kube.service_account_token(*HANDLER_SA)
    kubeconfig = kube.kubeconfig(token, tmp_path / "handler.kubeconfig")
    started: list[Replica] = []

    def start(identity: str) -> Replica:
        r = Replica(identity, kubeconfig, tmp_path / f"{identity}.log")
        started.append(r)
        return r

    yield start
    for r in started:
        r.stop()


def holder(admin: client.ApiClient) -> str | None:
    try:
        lease = client.CoordinationV1Api(admin).read_namespaced_lease(
            "execwatch-handler", crd.DEFAULT_NAMESPACE
        )
    except client.exceptions.ApiException:
        return None
    return str(lease.spec.holder_identity) if lease.spec.holder_identity else None


def test_the_standby_takes_over_within_the_lease_and_nothing_is_counted_twice(
    admin: client.ApiClient,
    agent_api: client.ApiClient,
    make_pod: PodFactory,
    namespace: str,
    replicas: Callable[[str], Replica],
) -> None:
    pod = make_pod()
    by_id = {r.identity: r for r in (replicas("replica-a"), replicas("replica-b"))}
    leader = by_id[wait_until(lambda: holder(admin), timeout=20)]
    standby = next(r for r in by_id.values() if r is not leader)

    for _ in range(10):
        publish(agent_api, exec_failure(pod=pod, count=2))
    wait_until(lambda: not list_records(admin), timeout=20)
    # A record is deleted just before it is counted: wait for the count, then check it
    # does not move past the truth.
    wait_until(lambda: leader.metric("execwatch_exec_failures_total", namespace=namespace) == 20)
    time.sleep(0.5)
    assert leader.metric("execwatch_exec_failures_total", namespace=namespace) == 20

    # A burst, and the leader dies in the middle of it.
    for _ in range(30):
        publish(agent_api, exec_failure(pod=pod, count=1))
    wait_until(lambda: len(list_records(admin)) < 25, timeout=20)
    leader.proc.send_signal(signal.SIGSTOP)  # freeze it, let in-flight requests land
    time.sleep(0.5)
    left = list_records(admin)
    killed_at = time.monotonic()
    leader.proc.kill()
    leader.proc.wait()

    wait_until(lambda: holder(admin) == standby.identity, timeout=3 * LEASE_DURATION)
    takeover = time.monotonic() - killed_at
    wait_until(lambda: not list_records(admin), timeout=20)
    assert takeover <= LEASE_DURATION + 2.0, takeover
    wait_until(
        lambda: standby.metric("execwatch_handler_records_total", result="handled") == len(left)
    )
    time.sleep(0.5)
    assert standby.metric("execwatch_exec_failures_total", namespace=namespace) == len(left)
    assert standby.metric("execwatch_handler_records_total", result="handled") == len(left)
    [event] = events_of(admin, namespace)
    assert event.series.count == 20 + 30  # every failure once: none lost, none twice


def test_a_clean_shutdown_hands_the_lease_over_at_once(
    admin: client.ApiClient, replicas: Callable[[str], Replica]
) -> None:
    by_id = {r.identity: r for r in (replicas("replica-c"), replicas("replica-d"))}
    leader = by_id[wait_until(lambda: holder(admin), timeout=20)]
    standby = next(r for r in by_id.values() if r is not leader)
    wait_until(lambda: standby.serving() and leader.serving(), timeout=10)
    stopped_at = time.monotonic()
    leader.stop()
    wait_until(lambda: holder(admin) == standby.identity, timeout=10)
    assert time.monotonic() - stopped_at < LEASE_DURATION  # released, not expired


def test_an_api_server_restart_under_a_live_watch_loses_nothing(
    kube: KubeCluster,
    admin: client.ApiClient,
    make_pod: PodFactory,
    namespace: str,
    start_handler: Callable[..., Handler],
) -> None:
    pod = make_pod()
    # A Lease longer than the outage, so the same leader must resume its own watch.
    handler = start_handler(lease_duration=30.0, renew_deadline=20.0, retry_period=1.0)
    wait_until(handler.elector.is_leader)
    publisher = Publisher(
        PublisherConfig(node=NODE, aggregation_window=3600, backoff_initial=0.2, backoff_max=1.0),
        RecordApi(
            kube.rest(kube.node_token(*AGENT_SA, NODE), timeout=2.0),
            crd.DEFAULT_NAMESPACE,
        ),
    )
    publisher.start()
    submitted = 0

    def submit_some(n: int) -> None:
        nonlocal submitted
        for _ in range(n):
            submitted += 1
            # a distinct path per failure: every one is its own record
            publisher.submit(exec_failure(pod=pod, path=f"/bin/tool-{submitted}"))
            time.sleep(0.02)

    try:
        submit_some(20)
        wait_until(lambda: failures_total(handler, namespace=namespace) == 20, timeout=20)
        assert kube.apiserver is not None
        kube.apiserver.stop()
        submit_some(20)  # the agent spools these
        kube.restart_apiserver()
        submit_some(20)
        wait_until(lambda: publisher.spooled() == 0, timeout=30)
        wait_until(lambda: failures_total(handler, namespace=namespace) == 60, timeout=30)
    finally:
        publisher.stop(flush_timeout=0)
    assert not list_records(admin)
    assert len(events_of(admin, namespace)) == 60
    assert handler.elector.is_leader()
    assert handler.metrics.registry.get_sample_value("execwatch_handler_leader") == 1
    # The watch really broke and was resumed (not a lucky quiet window).
    assert (
        sum(
            s.value
            for m in handler.metrics.registry.collect()
            for s in m.samples
            if s.name == "execwatch_handler_api_errors_total" and s.labels["verb"] == "watch"
        )
        >= 1
    )
