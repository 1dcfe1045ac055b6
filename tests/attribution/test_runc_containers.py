"""Real runc containers in kubelet-shaped cgroups, attributed by the cgroup id the probe saw."""

from __future__ import annotations

import subprocess

import pytest

from execwatch.attribution import Attributor
from execwatch.attribution.mounts import cgroup_mounts
from execwatch.record import AttributionStatus
from tests.support.probe.probe_recorder import ProbeRecorder
from tests.support.runtime.runc import (
    KubeletCgroup,
    Runc,
    remove_pod_cgroups,
)


def cgroup_exists(path: str) -> bool:
    unified = cgroup_mounts().unified
    assert unified is not None
    fs_path = unified.to_fs_path(path)
    return fs_path is not None and fs_path.exists()


@pytest.mark.parametrize("qos", ["guaranteed", "burstable", "besteffort"])
@pytest.mark.parametrize("driver", ["systemd", "cgroupfs"])
def test_a_container_that_dies_at_once_resolves_after_its_cgroup_is_gone(
    driver: str, qos: str, runc: Runc, probe: ProbeRecorder, host_attributor: Attributor
) -> None:
    cgroup = KubeletCgroup.new(driver, qos)
    try:
        foreign = runc.foreign_path(cgroup.container_id[:16])
        rc = runc.run(cgroup, [foreign, "true"])
        assert rc != 0  # runc: "exec format error"
        event = probe.failed_exec(foreign)
        assert not cgroup_exists(cgroup.path), "runc removes the cgroup when the container exits"

        got = host_attributor.resolve(event.cgroup_id, event.tgid)

        assert got.status is AttributionStatus.PARTIAL  # no runtime knows it: no names
        assert got.cgroup_path == cgroup.path
        assert got.pod_uid == cgroup.pod_uid
        assert got.container_id == cgroup.container_id
        assert got.runtime == ("containerd" if driver == "systemd" else None)
        assert got.pod is None and got.namespace is None
    finally:
        remove_pod_cgroups(cgroup.pod_path)


def test_a_failing_side_process_is_attributed_to_the_container_that_keeps_running(
    runc: Runc, probe: ProbeRecorder, host_attributor: Attributor
) -> None:
    cgroup = KubeletCgroup.new("cgroupfs", "burstable")
    name = runc.start_detached(cgroup, ["/bin/sleep", "300"])
    try:
        foreign = runc.foreign_path(cgroup.container_id[:16])
        assert runc.exec(name, [foreign, "echo", "hi"]) != 0
        event = probe.failed_exec(foreign)
        state = subprocess.run(
            ["runc", "--root", str(runc.state), "state", name],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert '"status": "running"' in state

        assert host_attributor.container_id(event.cgroup_id) == cgroup.container_id
        live = host_attributor.resolve(event.cgroup_id, event.tgid)
        assert (live.pod_uid, live.container_id) == (cgroup.pod_uid, cgroup.container_id)
        assert cgroup_exists(cgroup.path)

        runc.delete(name)
        assert not cgroup_exists(cgroup.path)
        later = host_attributor.resolve(event.cgroup_id)
        assert (later.pod_uid, later.container_id) == (cgroup.pod_uid, cgroup.container_id)
    finally:
        runc.delete(name)
        remove_pod_cgroups(cgroup.pod_path)


def test_host_processes_are_host_and_unknown_ids_unattributed(
    probe: ProbeRecorder, host_attributor: Attributor
) -> None:
    unified = cgroup_mounts().unified
    assert unified is not None
    root_id = unified.mountpoint.stat().st_ino
    assert host_attributor.resolve(root_id).status is AttributionStatus.HOST
    nothing = host_attributor.resolve(2**62 + 7)
    assert nothing.status is AttributionStatus.UNATTRIBUTED
    assert nothing.cgroup_path is None and nothing.pod_uid is None
