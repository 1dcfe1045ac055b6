"""Failures inside real containerd containers are diagnosed and attributed end to end,
including an entrypoint that dies at once and leaves no task behind."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from execwatch.attribution import Attributor
from execwatch.attribution.cri.client import CriContainers
from execwatch.record import AttributionStatus, ExecFailure, Reason
from tests.probe.conftest import Tracer
from tests.support.runtime.containerd import Containerd
from tests.support.runtime.runc import FOREIGN_ARCH, FOREIGN_IN_ROOTFS


def in_pod(uid: str) -> Callable[[ExecFailure], bool]:
    return lambda r: r.event.path == FOREIGN_IN_ROOTFS and r.attribution.pod_uid == uid


@pytest.fixture
def pod_tracer(containerd: Containerd) -> Iterator[Tracer]:
    with (
        Attributor(containers=CriContainers(sockets=[containerd.socket])) as attributor,
        Tracer.open(attributor) as tracer,
    ):
        yield tracer


def test_foreign_entrypoint_of_a_dying_container(
    containerd: Containerd, pod_tracer: Tracer
) -> None:
    pod = containerd.run_pod(
        "api-5f7c9d-abcde", namespace="shop", labels={"pod-template-hash": "5f7c9d"}
    )
    try:
        containerd.create_container(pod, "api", [FOREIGN_IN_ROOTFS, "serve"])

        record = pod_tracer.wait_for(in_pod(pod.uid), timeout=15)
    finally:
        containerd.remove_pod(pod)

    assert record.diagnosis.reason is Reason.FOREIGN_ARCHITECTURE
    assert record.diagnosis.binary_arch == FOREIGN_ARCH
    a = record.attribution
    assert a.status is AttributionStatus.ATTRIBUTED
    assert (a.namespace, a.pod, a.container, a.workload_kind, a.workload) == (
        "shop", "api-5f7c9d-abcde", "api", "Deployment", "api"
    )  # fmt: skip


@pytest.fixture(scope="module")
def containerd_apart(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Containerd]:
    """A containerd whose mounts the tracer's mount namespace never sees, as for an agent
    pod: only its shim, the dying container's parent, shows the rootfs."""
    runtime = Containerd(tmp_path_factory.mktemp("containerd-apart"), own_mounts=True)
    try:
        runtime.start()
        yield runtime
    finally:
        runtime.stop()


def test_dying_container_of_a_runtime_whose_mounts_we_cannot_see(
    containerd_apart: Containerd,
) -> None:
    assert containerd_apart.process is not None
    apart = f"/proc/{containerd_apart.process.pid}/ns/mnt"
    assert os.stat(apart).st_ino != os.stat("/proc/self/ns/mnt").st_ino
    with (
        Attributor(containers=CriContainers(sockets=[containerd_apart.socket])) as attributor,
        Tracer.open(attributor) as tracer,
    ):
        pod = containerd_apart.run_pod("api-0", namespace="shop", labels={})
        try:
            containerd_apart.create_container(pod, "api", [FOREIGN_IN_ROOTFS, "serve"])
            record = tracer.wait_for(in_pod(pod.uid), timeout=15)
        finally:
            containerd_apart.remove_pod(pod)

    assert record.diagnosis.reason is Reason.FOREIGN_ARCHITECTURE, record.diagnosis
    assert record.diagnosis.binary_arch == FOREIGN_ARCH


def test_side_process_failing_in_a_healthy_container(
    containerd: Containerd, pod_tracer: Tracer, tmp_path: Path
) -> None:
    pod = containerd.run_pod("worker-0", namespace="jobs", labels={})
    try:
        main = containerd.create_container(pod, "main", ["/bin/sleep", "300"])
        assert containerd.exec_sync(main, [FOREIGN_IN_ROOTFS, "--version"]) != 0

        record = pod_tracer.wait_for(in_pod(pod.uid), timeout=15)
    finally:
        containerd.remove_pod(pod)

    assert record.diagnosis.reason is Reason.FOREIGN_ARCHITECTURE
    assert (record.attribution.pod, record.attribution.container) == ("worker-0", "main")
