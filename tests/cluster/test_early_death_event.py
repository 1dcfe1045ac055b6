"""End to end on this host: a side process that dies in its dynamic loader inside a runc
container of a Pod in the real API server ends in a Warning Event `MissingLibrary`.

The same path as tests/cluster/test_end_to_end.py (probe, diagnosis, attribution with the
agent's pod watch, publisher, handler), with an early death instead of a failed exec.
"""

from __future__ import annotations

import secrets
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from execwatch.cluster.handler import LABEL, Handler
from tests.attribution.containerd_env import LIBRARY_MISSING, LIBRARY_MISSING_FILES
from tests.attribution.runc_env import KubeletCgroup, Runc, remove_pod_cgroups
from tests.cluster.conftest import NODE, PodFactory, wait_until
from tests.cluster.test_end_to_end import pod_reader_rbac, running_agent
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
    agent_lightkube: Any,
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
        with running_agent(agent_lightkube):
            name = runc.start_detached(cgroup, ["/bin/sleep", "300"])
            assert runc.exec(name, [LIBRARY_MISSING]) == 127  # the loader's exit code
            [event] = wait_until(lambda: events_of(admin, namespace), timeout=15)
    finally:
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
