"""Early deaths inside real containers, for every case of the host test's table.

Each case's root (tests/support/probe/deaths.py) becomes a containerd image and a runc root.
In containerd the case dies as a pod's entrypoint (no task is left: the diagnosis reads
the container's rootfs, found from the container id before the runtime unmounts it) and
as a side process of a healthy sidecar of the same image; in runc as a side process of a
container placed in a kubelet-shaped cgroup. Every failure is attributed to its own
container, StartupCrash is shown only with the flag, and the benign exits never are.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from execwatch.attribution import Attributor
from execwatch.attribution.cri.client import CriContainers
from execwatch.diagnosis import FileDiagnoser
from execwatch.probe import Probe
from execwatch.probe.events import decode_record
from execwatch.record import AttributionStatus, EarlyDeath, ExecFailure, Reason
from tests.support.probe.deaths import BY_NAME, DEATHS, KEEPALIVE, Death, DeathTracer
from tests.support.probe.debian_roots import Keepers, keepers
from tests.support.runtime.containerd import Containerd, Pod, oci_archive_of
from tests.support.runtime.runc import (
    KubeletCgroup,
    Runc,
    remove_empty_kubepods,
    remove_pod_cgroups,
)

__all__ = ["keepers"]


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    top = tmp_path_factory.mktemp("death-roots")
    return {death.name: death.container_root(top / death.name) for death in DEATHS}


@pytest.fixture(scope="module")
def images(containerd: Containerd, roots: dict[str, Path]) -> dict[str, str]:
    """Case name -> image reference in containerd's k8s.io namespace."""
    made = {}
    for name, root in roots.items():
        image = f"docker.io/execwatch/death-{name}:test"
        archive = root.parent / f"{name}.tar"
        containerd.import_image(oci_archive_of(archive, image, root, KEEPALIVE))
        made[name] = image
    return made


@pytest.fixture(scope="module")
def runc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runc]:
    runtime = Runc(tmp_path_factory.mktemp("runc"))
    yield runtime
    runtime.cleanup()
    remove_empty_kubepods()


@dataclass
class Tracers:
    """The pipeline as the agent runs it (quiet), and as `trace --show-crashes` does."""

    quiet: DeathTracer
    crashes: DeathTracer
    attributor: Attributor

    def container_sent(self, container_id: str) -> bool:
        """Whether the kernel sent any early death of this container at all."""
        return any(
            self.attributor.container_id(
                e.cgroup_id, e.tgid, name=e.cgroup_name, parent_id=e.cgroup_parent_id
            )
            == container_id
            for e in self.quiet.kernel_events
        )

    def lost_the_race(self, death: Death, container_id: str) -> bool:
        """Whether containerd unmounted the dead container's rootfs before a diagnosis
        opened it (a few in 100 on a loaded machine, docs/trace.md): then the death is
        shown as Undiagnosed, as it must be, and tells nothing about the case."""
        if death.reason is None:
            return False  # nothing is sent, nothing is diagnosed
        deadline = time.monotonic() + 15
        while not self.container_sent(container_id):
            assert time.monotonic() < deadline, "the kernel sent nothing"
            time.sleep(0.05)
        self.quiet.settle(0.1)
        self.crashes.settle(0.1)
        return any(
            r.attribution.container_id == container_id
            and r.diagnosis.reason is Reason.UNDIAGNOSED
            and "the task is gone" in r.diagnosis.detail
            for r in [*self.quiet.records, *self.crashes.records]
        )

    def expect(self, death: Death, container_id: str) -> ExecFailure | None:
        """What must come of the case in this container; the record shown, if any."""

        def mine(r: ExecFailure) -> bool:
            return r.attribution.container_id == container_id and r.event.path == death.path

        if death.shown:
            record = self.quiet.wait_for(mine, timeout=15)
            death.check(record)
            return record
        if death.reason is Reason.STARTUP_CRASH:
            record = self.crashes.wait_for(mine, timeout=15)
            death.check(record)
        else:
            self.crashes.settle(1.0)
            assert not [r for r in self.crashes.records if mine(r)]
        self.quiet.settle(0.5)
        assert not [r for r in self.quiet.records if mine(r)]
        assert self.container_sent(container_id) is (death.reason is not None)
        if death.reason is not None:
            assert death.reason in self.quiet.observed.reasons()  # counted, never shown
        return record if death.reason is Reason.STARTUP_CRASH else None


def tracers(attributor: Attributor) -> Iterator[Tracers]:
    with (
        attributor,
        DeathTracer.open(show_crashes=False, attributor=attributor) as quiet,
        DeathTracer.open(show_crashes=True, attributor=attributor) as crashes,
    ):
        yield Tracers(quiet, crashes, attributor)


@pytest.fixture
def cri_tracers(containerd: Containerd) -> Iterator[Tracers]:
    yield from tracers(Attributor(containers=CriContainers(sockets=[containerd.socket])))


@pytest.fixture
def host_tracers() -> Iterator[Tracers]:
    """No runtime to ask: what the cgroup path alone says."""
    yield from tracers(Attributor(containers=CriContainers(sockets=[])))


def dying_entrypoint(
    containerd: Containerd, pod: Pod, death: Death, image: str, tracers: Tracers
) -> tuple[str, ExecFailure | None]:
    """The pod's entrypoint dies; the kubelet would restart it, so a lost race with
    containerd's unmount is tried again, up to three containers in all."""
    for _ in range(3):
        container_id = containerd.create_container(pod, "app", list(death.argv), image=image)
        containerd.wait_exited(container_id)
        if not tracers.lost_the_race(death, container_id):
            return container_id, tracers.expect(death, container_id)
        containerd.remove_container(container_id)
    raise AssertionError("containerd unmounted the rootfs first three times in a row")


@pytest.mark.parametrize("death", DEATHS, ids=lambda d: d.name)
def test_containerd_entrypoint_and_side_process(
    death: Death, containerd: Containerd, images: dict[str, str], cri_tracers: Tracers
) -> None:
    pod = containerd.run_pod(
        f"{death.name}-7d9f8c-xyz12", namespace="shop", labels={"pod-template-hash": "7d9f8c"}
    )
    try:
        image = images[death.name]
        sidecar = containerd.create_container(pod, "sidecar", KEEPALIVE, image=image)
        assert containerd.exec_sync(sidecar, list(death.argv)) == death.exit_status
        side = cri_tracers.expect(death, sidecar)
        entrypoint, dead = dying_entrypoint(containerd, pod, death, image, cri_tracers)
    finally:
        containerd.remove_pod(pod)

    for record, container_id, name in ((dead, entrypoint, "app"), (side, sidecar, "sidecar")):
        if record is None:
            continue
        a = record.attribution
        assert a.status is AttributionStatus.ATTRIBUTED
        assert (a.container_id, a.runtime) == (container_id, "containerd")
        assert (a.namespace, a.pod, a.container, a.workload_kind, a.workload) == (
            "shop", pod.name, name, "Deployment", death.name
        )  # fmt: skip


@pytest.mark.parametrize("death", DEATHS, ids=lambda d: d.name)
def test_runc_side_process(
    death: Death, runc: Runc, roots: dict[str, Path], host_tracers: Tracers
) -> None:
    cgroup = KubeletCgroup.new("systemd", "burstable")
    name = runc.start_detached(cgroup, KEEPALIVE, rootfs=roots[death.name])
    try:
        assert runc.exec(name, list(death.argv)) == death.exit_status

        record = host_tracers.expect(death, cgroup.container_id)
    finally:
        runc.delete(name)
        remove_pod_cgroups(cgroup.pod_path)

    if record is not None:
        a = record.attribution
        assert a.status is AttributionStatus.PARTIAL  # no runtime to name the pod
        assert (a.container_id, a.runtime, a.pod_uid) == (
            cgroup.container_id,
            "containerd",
            cgroup.pod_uid,
        )


def died_in(keepers: Keepers, root: Path, *, alone: bool, own_mounts: bool = False) -> EarlyDeath:
    """The kernel's record of ls dying in `root`; alone: once no task is left in that root
    (else its keeper lingers there while the record is diagnosed)."""
    raw: list[bytes] = []
    with Probe() as probe:
        probe.open_ring_buffer(raw.append)
        ran = keepers.run(
            ["/usr/bin/ls", "/"], root=root, linger=0 if alone else 3, own_mounts=own_mounts
        )
        if alone:
            keepers.reap()  # the keeper (with its mount namespace): the last task in that root
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not (
            events := [e for e in (decode_record(r, 0) for r in raw) if e.tgid == ran.pid]
        ):
            probe.poll(50)
    [event] = events
    assert isinstance(event, EarlyDeath) and event.exit_code == 127
    return event


def test_an_exit_whose_root_is_gone_is_reported_undiagnosed_never_benign(
    keepers: Keepers, tmp_path: Path
) -> None:
    """A container whose entrypoint died and whose rootfs the runtime unmounted first: the
    binary cannot be read, so nothing says the exit was harmless."""
    root = BY_NAME["missing-library"].build(tmp_path)
    event = died_in(keepers, root, alone=True, own_mounts=True)

    assert event.mntns != os.stat("/proc/self/ns/mnt").st_ino
    diagnosis = FileDiagnoser.for_host(None).diagnose(event)
    assert diagnosis.reason is Reason.UNDIAGNOSED
    assert "the task is gone" in diagnosis.detail


def test_a_root_not_found_once_is_looked_for_again(keepers: Keepers, tmp_path: Path) -> None:
    """Results are cached per mount namespace, root and executable; a root that could not
    be read once (gone, or a slow mount) must not stay unread for the next death there."""
    root = BY_NAME["missing-library"].build(tmp_path)
    diagnoser = FileDiagnoser.for_host(None)
    first = died_in(keepers, root, alone=True)
    assert diagnoser.diagnose(first).reason is Reason.UNDIAGNOSED

    again = died_in(keepers, root, alone=False)

    same = ("mntns", "root_ino", "exe_ino", "exe_dev", "exit_code", "signal")
    assert [getattr(again, f) for f in same] == [getattr(first, f) for f in same]
    assert diagnoser.diagnose(again).reason is Reason.MISSING_LIBRARY
