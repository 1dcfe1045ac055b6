"""Early deaths inside real containerd containers: diagnosed in the container's root and
attributed to the pod, for a dying entrypoint and for a side process of a healthy one."""

from __future__ import annotations

from collections.abc import Callable

from execwatch.record import AttributionStatus, ExecFailure, Reason
from tests.attribution.containerd_env import LIBRARY_MISSING, Containerd
from tests.probe.conftest import Tracer
from tests.probe.test_container_diagnosis import pod_tracer

__all__ = ["pod_tracer"]


def died_in_pod(uid: str) -> Callable[[ExecFailure], bool]:
    return lambda r: r.event.path == LIBRARY_MISSING and r.attribution.pod_uid == uid


def test_entrypoint_whose_library_is_missing(containerd: Containerd, pod_tracer: Tracer) -> None:
    pod = containerd.run_pod(
        "lister-7d9f8c-xyz12", namespace="shop", labels={"pod-template-hash": "7d9f8c"}
    )
    try:
        containerd.create_container(pod, "lister", [LIBRARY_MISSING])

        record = pod_tracer.wait_for(died_in_pod(pod.uid), timeout=15)
    finally:
        containerd.remove_pod(pod)

    assert record.diagnosis.reason is Reason.MISSING_LIBRARY
    assert record.diagnosis.library == "libselinux.so.1"
    assert (record.event.exit_code, record.event.status) == (127, "EXIT127")
    a = record.attribution
    assert a.status is AttributionStatus.ATTRIBUTED
    assert (a.namespace, a.pod, a.container, a.workload_kind, a.workload) == (
        "shop", "lister-7d9f8c-xyz12", "lister", "Deployment", "lister"
    )  # fmt: skip


def test_side_process_dying_in_a_healthy_container(
    containerd: Containerd, pod_tracer: Tracer
) -> None:
    pod = containerd.run_pod("batch-0", namespace="jobs", labels={})
    try:
        main = containerd.create_container(pod, "main", ["/bin/sleep", "300"])
        assert containerd.exec_sync(main, [LIBRARY_MISSING]) == 127

        record = pod_tracer.wait_for(died_in_pod(pod.uid), timeout=15)
    finally:
        containerd.remove_pod(pod)

    assert record.diagnosis.reason is Reason.MISSING_LIBRARY
    assert record.diagnosis.library == "libselinux.so.1"
    assert (record.attribution.pod, record.attribution.container) == ("batch-0", "main")
