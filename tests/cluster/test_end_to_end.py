"""End to end on this host: a real failed exec in a runc container placed in a
kubelet-shaped cgroup, for a Pod that exists in the API server, ends in the Warning
Event, the pod label and the metric.

Real parts: the BPF probe (root), the diagnosis of the real arm64 binary, attribution
from the kernel's cgroup id plus the agent's node-scoped pod watch (the optional
pod-reader RBAC), the publisher with the agent's token, the handler with its own.
"""

from __future__ import annotations

import contextlib
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry

from execwatch import crd
from execwatch.agent import daemon
from execwatch.agent.metrics import PublisherMetrics
from execwatch.agent.publisher import Publisher, PublisherConfig
from execwatch.agent.records import RecordApi
from execwatch.attribution import Attributor
from execwatch.attribution.cri.client import CriContainers
from execwatch.handler.controller import Handler
from tests.cluster.conftest import NODE, PodFactory, label_of
from tests.cluster.test_handler import events_of, failures_total
from tests.support.kube.apiserver import MANIFESTS, KubeCluster, load_manifests
from tests.support.runtime.runc import KubeletCgroup, Runc, remove_pod_cgroups
from tests.support.wait import wait_until


def series_count(event: Any) -> int:
    """How many failures an Event stands for (an Event without a series is one)."""
    return int(event.series.count) if event.series else 1


@pytest.fixture
def pod_reader_rbac(kube: KubeCluster, admin: client.ApiClient) -> Iterator[None]:
    """The optional agent pod-reader RBAC, only for this test (others assert its absence)."""
    kube.apply(load_manifests(MANIFESTS / "optional"))
    yield
    rbac = client.RbacAuthorizationV1Api(admin)
    with contextlib.suppress(ApiException):
        rbac.delete_cluster_role_binding("execwatch-agent-pod-reader")
    with contextlib.suppress(ApiException):
        rbac.delete_cluster_role("execwatch-agent-pod-reader")


@contextlib.contextmanager
def running_agent(agent_rest: Any) -> Iterator[None]:
    """The node agent as the DaemonSet runs it (probe, diagnosis, attribution with the
    node-scoped pod watch, publisher with the agent's token), started and ready."""
    registry = CollectorRegistry()
    publisher = Publisher(
        PublisherConfig(node=NODE, aggregation_window=3.0),
        RecordApi(agent_rest, crd.DEFAULT_NAMESPACE),
        PublisherMetrics(registry=registry),
    )
    pods = daemon.pod_cache(NODE, agent_rest)
    attributor = Attributor(containers=CriContainers(sockets=[]), pods=pods)
    stop, ready = threading.Event(), threading.Event()
    loop = threading.Thread(
        target=daemon.run,
        args=(publisher, attributor, stop),
        kwargs={"registry": registry, "ready": ready},
        daemon=True,
    )
    try:
        attributor.start()
        assert pods.synced.wait(10), "the agent's pod watch did not sync"
        publisher.start()
        loop.start()
        assert ready.wait(15), "the probe did not start"
        yield
    finally:
        stop.set()
        if loop.is_alive():
            loop.join(timeout=10)
        publisher.stop(flush_timeout=0)
        attributor.close()


def test_a_foreign_binary_failing_in_a_runc_container_ends_in_one_event_a_label_a_metric(
    admin: client.ApiClient,
    agent_rest: Any,
    make_pod: PodFactory,
    namespace: str,
    start_handler: Callable[..., Handler],
    runc: Runc,
    pod_reader_rbac: None,
) -> None:
    container_id = secrets.token_hex(32)
    pod = make_pod(container_ids={"app": container_id})
    cgroup = KubeletCgroup("systemd", "besteffort", pod["metadata"]["uid"], container_id)
    handler = start_handler()
    try:
        with running_agent(agent_rest):
            # The container keeps running (its root stays readable for the diagnosis) while
            # its command fails to start again and again, as a liveness/exec probe or a
            # supervisor inside the container would.
            name = runc.start_detached(cgroup, ["/bin/sleep", "300"])
            foreign = runc.foreign_path(container_id[:16])
            started = time.monotonic()
            assert runc.exec(name, [foreign, "true"]) != 0  # "exec format error"
            [event] = wait_until(lambda: events_of(admin, namespace), timeout=10)
            first_event_after = time.monotonic() - started
            for _ in range(2):  # it goes on failing: the same Event grows
                assert runc.exec(name, [foreign, "true"]) != 0
            wait_until(lambda: series_count(events_of(admin, namespace)[0]) == 3, timeout=15)
    finally:
        runc.cleanup()
        remove_pod_cgroups(cgroup.pod_path)

    [event] = events_of(admin, namespace)
    assert event.type == "Warning" and event.reason == "ExecFormatError"
    assert event.regarding.uid == pod["metadata"]["uid"]
    assert foreign in event.note and 'container "app"' in event.note
    assert "arm64 binary on a amd64 node" in event.note
    assert label_of(admin, pod) == "ExecFormatError"
    wait_until(handler.idle)  # the last record is deleted just before it is counted
    assert (
        failures_total(
            handler,
            namespace=namespace,
            workload="app",
            container="app",
            node=NODE,
            node_arch="amd64",
            binary_arch="arm64",
            reason="ForeignArchitecture",
        )
        == 3
    )
    assert first_event_after < 5.0
