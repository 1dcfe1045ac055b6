"""A container cgroup created and removed before the inventory listed it is still
attributed: the probe records the cgroup's own name and its parent's id, and the pod's
cgroup (the parent) outlives its containers'."""

from __future__ import annotations

import errno
import os
import secrets
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from execwatch.attribution import Attributor
from execwatch.attribution.mounts import cgroup_mounts
from execwatch.record import AttributionStatus, ExecFailed
from tests.support.probe.probe_recorder import ProbeRecorder


@pytest.fixture
def pod_cgroup() -> Iterator[tuple[Path, str]]:
    """/kubepods/besteffort/pod<uid> in the cgroupfs driver's layout."""
    unified = cgroup_mounts().unified
    assert unified is not None
    uid = str(uuid.uuid4())
    pod = unified.mountpoint / "kubepods" / "besteffort" / f"pod{uid}"
    pod.mkdir(parents=True)
    yield pod, uid
    for d in (pod, pod.parent, pod.parent.parent):
        try:
            d.rmdir()
        except OSError:
            break  # another test's pod lives there too


def wait_known(attributor: Attributor, cgroup: Path) -> None:
    assert attributor.inventory is not None
    deadline = time.monotonic() + 5
    while attributor.inventory.lookup(cgroup.stat().st_ino) is None:
        assert time.monotonic() < deadline, f"inventory never saw {cgroup}"
        time.sleep(0.02)


def test_the_probe_records_the_cgroup_name_and_its_parent(
    probe: ProbeRecorder, pod_cgroup: tuple[Path, str], foreign_root: Path, tmp_path: Path
) -> None:
    pod, _ = pod_cgroup
    container = pod / secrets.token_hex(32)
    container.mkdir()
    binary = tmp_path / f"tool-{container.name[:12]}"
    shutil.copy(foreign_root / "arm64/root/usr/bin/busybox", binary)
    pid = os.fork()
    if pid == 0:  # the child never returns
        (container / "cgroup.procs").write_text(str(os.getpid()))
        try:
            os.execv(binary, [str(binary)])
        finally:
            os._exit(0)
    os.waitpid(pid, 0)

    event = probe.wait_for(
        lambda e: isinstance(e, ExecFailed) and e.path == str(binary) and e.errno == errno.ENOEXEC
    )

    assert event.cgroup_id == container.stat().st_ino
    assert event.cgroup_name == container.name
    assert event.cgroup_parent_id == pod.stat().st_ino
    container.rmdir()


def test_an_unseen_container_cgroup_is_attributed_through_its_parent(
    host_attributor: Attributor, pod_cgroup: tuple[Path, str]
) -> None:
    pod, uid = pod_cgroup
    wait_known(host_attributor, pod)
    container_id = secrets.token_hex(32)
    never_listed = 2**62  # no cgroup has this id: the inventory cannot know it

    got = host_attributor.resolve(
        never_listed, None, name=container_id, parent_id=pod.stat().st_ino
    )

    assert got.status is AttributionStatus.PARTIAL  # no runtime here: ids, no names
    assert (got.pod_uid, got.container_id) == (uid, container_id)
    assert got.cgroup_path is not None and got.cgroup_path.endswith(f"/pod{uid}/{container_id}")


def test_a_name_cannot_climb_out_of_its_parent(
    host_attributor: Attributor, pod_cgroup: tuple[Path, str]
) -> None:
    pod, _ = pod_cgroup
    wait_known(host_attributor, pod)
    got = host_attributor.resolve(2**62, None, name="../../x", parent_id=pod.stat().st_ino)
    assert got.status is AttributionStatus.UNATTRIBUTED
    assert got.pod_uid is None
