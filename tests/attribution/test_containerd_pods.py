"""containerd's CRI plugin, pods created the way the kubelet creates them, real failing execs."""

from __future__ import annotations

import time

from execwatch.attribution import Attributor, AttributorConfig
from execwatch.attribution.cri import api_pb2 as pb
from execwatch.attribution.cri.client import CriContainers
from execwatch.attribution.mounts import cgroup_mounts
from execwatch.record import AttributionStatus
from tests.support.probe.probe_recorder import ProbeRecorder
from tests.support.runtime.containerd import APP_IMAGE, Containerd


def wait_cgroup_removed(path: str, timeout: float = 10) -> None:
    unified = cgroup_mounts().unified
    assert unified is not None
    fs_path = unified.to_fs_path(path)
    assert fs_path is not None
    deadline = time.monotonic() + timeout
    while fs_path.exists():
        assert time.monotonic() < deadline, f"{path} still exists"
        time.sleep(0.02)


def test_a_foreign_entrypoint_is_attributed_to_its_pod_after_the_container_is_gone(
    containerd: Containerd, probe: ProbeRecorder, cri_attributor: Attributor
) -> None:
    pod = containerd.run_pod(
        "web-7d4b9c8f5-x2x9q", namespace="shop", labels={"pod-template-hash": "7d4b9c8f5"}
    )
    try:
        foreign = containerd.foreign_path(pod)
        cid = containerd.create_container(pod, "app", [foreign, "true"])
        event = probe.failed_exec(foreign)
        containerd.wait_exited(cid)
        cgroup_path = f"{pod.cgroup_parent}/{cid}"
        wait_cgroup_removed(cgroup_path)

        got = cri_attributor.resolve(event.cgroup_id, event.tgid)

        assert got.status is AttributionStatus.ATTRIBUTED
        assert got.cgroup_path == cgroup_path
        assert (got.pod_uid, got.container_id, got.runtime) == (pod.uid, cid, "containerd")
        assert (got.namespace, got.pod, got.container) == ("shop", "web-7d4b9c8f5-x2x9q", "app")
        assert got.image == APP_IMAGE
        assert (got.workload_kind, got.workload) == ("Deployment", "web")
    finally:
        containerd.remove_pod(pod)


def test_a_failing_side_process_names_the_container_whose_main_process_keeps_running(
    containerd: Containerd, probe: ProbeRecorder, cri_attributor: Attributor
) -> None:
    pod = containerd.run_pod(
        "db-0",
        namespace="data",
        labels={
            "controller-revision-hash": "db-5c9d8",
            "statefulset.kubernetes.io/pod-name": "db-0",
        },
    )
    try:
        main = containerd.create_container(pod, "main", ["/bin/sleep", "300"])
        foreign = containerd.foreign_path(pod)
        assert containerd.exec_sync(main, [foreign, "echo"]) != 0
        event = probe.failed_exec(foreign)
        assert containerd.container_state(main) == pb.CONTAINER_RUNNING

        got = cri_attributor.resolve(event.cgroup_id, event.tgid)

        assert got.status is AttributionStatus.ATTRIBUTED
        assert (got.pod, got.container, got.container_id) == ("db-0", "main", main)
        assert (got.workload_kind, got.workload) == ("StatefulSet", "db")
    finally:
        containerd.remove_pod(pod)


def test_a_pod_deleted_before_the_lookup_keeps_what_is_known(
    containerd: Containerd, probe: ProbeRecorder, cri_attributor: Attributor
) -> None:
    no_prefetch = Attributor(
        config=AttributorConfig(prefetch=False),
        containers=CriContainers(sockets=[containerd.socket]),
    )
    no_prefetch.start()
    pod = containerd.run_pod("job-x-abcde", namespace="batch", labels={"job-name": "job-x"})
    try:
        foreign = containerd.foreign_path(pod)
        cid = containerd.create_container(pod, "task", [foreign, "true"])
        event = probe.failed_exec(foreign)
        containerd.wait_exited(cid)
        deadline = time.monotonic() + 10
        while not cri_attributor.has_names_for(cid):  # fetched when its cgroup appeared
            assert time.monotonic() < deadline, "the container was never looked up ahead"
            time.sleep(0.01)
        containerd.remove_pod(pod)  # kubelet removed sandbox and containers: CRI forgets them
        wait_cgroup_removed(f"{pod.cgroup_parent}/{cid}")

        partial = no_prefetch.resolve(event.cgroup_id, event.tgid)
        assert partial.status is AttributionStatus.PARTIAL
        assert (partial.pod_uid, partial.container_id) == (pod.uid, cid)
        assert partial.cgroup_path == f"{pod.cgroup_parent}/{cid}"
        assert partial.pod is None and partial.container is None

        # Looked up ahead when its cgroup appeared, the container keeps its names.
        remembered = cri_attributor.resolve(event.cgroup_id, event.tgid)
        assert remembered.status is AttributionStatus.ATTRIBUTED
        assert (remembered.namespace, remembered.pod, remembered.container) == (
            "batch",
            "job-x-abcde",
            "task",
        )
        assert (remembered.workload_kind, remembered.workload) == ("Job", "job-x")
    finally:
        no_prefetch.close()
        containerd.remove_pod(pod)


def test_the_pause_container_is_the_pods_sandbox(
    containerd: Containerd, cri_attributor: Attributor
) -> None:
    pod = containerd.run_pod("lonely", namespace="default")
    try:
        unified = cgroup_mounts().unified
        assert unified is not None
        sandbox_dir = unified.to_fs_path(f"{pod.cgroup_parent}/{pod.sandbox_id}")
        assert sandbox_dir is not None
        got = cri_attributor.resolve(sandbox_dir.stat().st_ino)
        assert got.status is AttributionStatus.ATTRIBUTED
        assert (got.pod, got.container, got.container_id) == ("lonely", "POD", pod.sandbox_id)
        assert got.workload is None  # a bare pod has no owner, and none is guessed
    finally:
        containerd.remove_pod(pod)
