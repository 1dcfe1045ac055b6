"""End to end on this host: a side process that dies in its dynamic loader inside a runc
container of a Pod in the real API server ends in a Warning Event `MissingLibrary`.

The same path as tests/cluster/test_end_to_end.py (probe, diagnosis, attribution with the
agent's pod watch, publisher, handler), with an early death instead of a failed exec.
"""

from __future__ import annotations

import secrets
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client
from prometheus_client import CollectorRegistry

from execwatch.attribution import Attributor
from execwatch.attribution.cri.client import CriContainers
from execwatch.cluster import agent, crd
from execwatch.cluster.handler import LABEL, Handler
from execwatch.cluster.metrics import PublisherMetrics
from execwatch.cluster.publisher import ApiSink, Publisher, PublisherConfig
from tests.attribution.containerd_env import LIBRARY_MISSING, LIBRARY_MISSING_FILES
from tests.attribution.runc_env import KubeletCgroup, Runc, remove_pod_cgroups
from tests.cluster.conftest import NODE, PodFactory, wait_until
from tests.cluster.test_end_to_end import pod_reader_rbac
from tests.cluster.test_handler import events_of, failures_total

__all__ = ["pod_reader_rbac"]


@pytest.fixture
def runc(tmp_path: Path) -> Iterator[Runc]:
    runtime = Runc(tmp_path / "runc")
    for dest, source in LIBRARY_MISSING_FILES.items():
        target = runtime.rootfs / dest
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
    yield runtime
    runtime.cleanup()


def test_a_side_process_dying_in_its_loader_ends_in_a_missing_library_event(
    admin: client.ApiClient,
    agent_api: client.ApiClient,
    make_pod: PodFactory,
    namespace: str,
    start_handler: Callable[..., Handler],
    runc: Runc,
    pod_reader_rbac: None,
) -> None:
    container_id = secrets.token_hex(32)
    pod = make_pod(container_ids={"app": container_id})
    cgroup = KubeletCgroup("systemd", "besteffort", pod["metadata"]["uid"], container_id)
    registry = CollectorRegistry()
    publisher = Publisher(
        PublisherConfig(node=NODE, aggregation_window=3.0),
        ApiSink(agent_api, crd.DEFAULT_NAMESPACE),
        PublisherMetrics(registry=registry),
    )
    pods = agent.pod_cache(NODE, agent_api)
    attributor = Attributor(containers=CriContainers(sockets=[]), pods=pods)
    stop, ready = threading.Event(), threading.Event()
    loop = threading.Thread(
        target=agent.run,
        args=(publisher, attributor, stop),
        kwargs={"registry": registry, "ready": ready},
        daemon=True,
    )
    handler = start_handler()
    try:
        attributor.start()
        assert pods.synced.wait(10), "the agent's pod watch did not sync"
        publisher.start()
        loop.start()
        assert ready.wait(15), "the probe did not start"

        name = runc.start_detached(cgroup, ["/bin/sleep", "300"])
        assert runc.exec(name, [LIBRARY_MISSING]) == 127  # the loader's exit code
        [event] = wait_until(lambda: events_of(admin, namespace), timeout=15)
    finally:
        stop.set()
        loop.join(timeout=10)
        publisher.stop(flush_timeout=0)
        attributor.close()
        runc.cleanup()
        remove_pod_cgroups(cgroup.pod_path)

    assert event.type == "Warning" and event.reason == "MissingLibrary"
    assert event.regarding.uid == pod["metadata"]["uid"]
    assert LIBRARY_MISSING in event.note and "(EXIT127)" in event.note
    assert "libselinux.so.1" in event.note
    labels = (
        client.CoreV1Api(admin)
        .read_namespaced_pod(pod["metadata"]["name"], namespace)
        .metadata.labels
    )
    assert labels[LABEL] == "MissingLibrary"
    wait_until(handler.idle)
    assert (
        failures_total(
            handler,
            namespace=namespace,
            workload="app",
            container="app",
            node=NODE,
            node_arch="amd64",
            binary_arch="amd64",
            reason="MissingLibrary",
        )
        == 1
    )
