"""Bad input and faults: hung or absent runtimes, contradicting sources, v1 hosts, pid reuse."""

from __future__ import annotations

import secrets
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from execwatch.attribution import Attributor, AttributorConfig, PodMeta, WorkloadRef
from execwatch.attribution.cri.client import CriContainers
from execwatch.attribution.metadata import (
    ContainerMeta,
    ContainerRole,
    CriContainer,
    CriUnavailable,
)
from execwatch.attribution.mounts import cgroup_mounts
from execwatch.record import AttributionStatus
from tests.support.runtime.runc import remove_pod_cgroups


@dataclass(frozen=True)
class FakeContainer:
    uid: str
    cid: str
    path: str
    cgroup_id: int


@pytest.fixture
def fake_container(root: None) -> Iterator[FakeContainer]:
    """A kubelet-shaped cgroup directory in the real unified hierarchy, no process in it."""
    unified = cgroup_mounts().unified
    assert unified is not None
    uid, cid = str(uuid.uuid4()), secrets.token_hex(32)
    path = f"/kubepods/burstable/pod{uid}/{cid}"
    fs_path = unified.to_fs_path(path)
    assert fs_path is not None
    fs_path.mkdir(parents=True)
    try:
        yield FakeContainer(uid, cid, path, fs_path.stat().st_ino)
    finally:
        remove_pod_cgroups(f"/kubepods/burstable/pod{uid}")


class StaticContainers:
    """A ContainerSource that answers from a dict, or fails like a dead runtime."""

    def __init__(self, known: dict[str, CriContainer], fail: bool = False) -> None:
        self.known, self.fail, self.calls = known, fail, 0

    def container(self, container_id: str, timeout: float) -> CriContainer | None:
        self.calls += 1
        if self.fail:
            raise CriUnavailable("runtime down")
        return self.known.get(container_id)

    def close(self) -> None:
        pass


class StaticPods:
    def __init__(self, pods: dict[str, PodMeta]) -> None:
        self.pods = pods

    def start(self) -> None:
        pass

    def close(self) -> None:
        pass

    def pod(self, uid: str) -> PodMeta | None:
        return self.pods.get(uid)


def cri(c: FakeContainer, pod_uid: str | None = None, **labels: str) -> CriContainer:
    return CriContainer(
        container_id=c.cid,
        pod_uid=pod_uid or c.uid,
        pod_name="api-0",
        namespace="prod",
        name="server",
        image="registry.example/api:1.2",
        role=ContainerRole.REGULAR,
        runtime="containerd",
        pod_labels=labels,
    )


def started(attributor: Attributor) -> Attributor:
    attributor.start()
    return attributor


def test_an_absent_runtime_socket_costs_nothing_and_leaves_a_partial_answer(
    fake_container: FakeContainer, tmp_path: Path
) -> None:
    attributor = started(Attributor(containers=CriContainers(sockets=[tmp_path / "absent.sock"])))
    try:
        t0 = time.monotonic()
        got = attributor.resolve(fake_container.cgroup_id)
        assert time.monotonic() - t0 < attributor.config.budget + 0.2
        assert got.status is AttributionStatus.PARTIAL
        assert (got.pod_uid, got.container_id) == (fake_container.uid, fake_container.cid)
    finally:
        attributor.close()


def test_a_hung_runtime_socket_is_cut_off_at_the_budget_then_skipped(
    fake_container: FakeContainer, tmp_path: Path
) -> None:
    hung = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    hung.bind(str(tmp_path / "hung.sock"))
    hung.listen(16)  # accepts connections in the backlog, never answers
    attributor = started(
        Attributor(
            config=AttributorConfig(budget=0.3, backoff=30, prefetch=False),
            containers=CriContainers(sockets=[tmp_path / "hung.sock"]),
        )
    )
    try:
        t0 = time.monotonic()
        first = attributor.resolve(fake_container.cgroup_id)
        first_took = time.monotonic() - t0
        t0 = time.monotonic()
        second = attributor.resolve(fake_container.cgroup_id)
        second_took = time.monotonic() - t0
        assert 0.25 <= first_took < 0.3 + 1.0  # the budget, plus slack for a loaded machine
        assert second_took < 0.05  # backing off: the event path does not wait again
        for got in (first, second):
            assert got.status is AttributionStatus.PARTIAL
            assert got.container_id == fake_container.cid
    finally:
        attributor.close()
        hung.close()


def test_a_runtime_naming_another_pod_is_not_believed(fake_container: FakeContainer) -> None:
    liar = StaticContainers({fake_container.cid: cri(fake_container, pod_uid=str(uuid.uuid4()))})
    attributor = started(Attributor(containers=liar))
    try:
        got = attributor.resolve(fake_container.cgroup_id)
        assert got.status is AttributionStatus.PARTIAL
        assert got.pod_uid == fake_container.uid
        assert got.pod is None and got.namespace is None and got.container is None
    finally:
        attributor.close()


def test_runtime_answers_are_cached_and_a_dead_runtime_is_not_asked_on_every_event(
    fake_container: FakeContainer,
) -> None:
    good = StaticContainers({fake_container.cid: cri(fake_container)})
    attributor = started(Attributor(config=AttributorConfig(prefetch=False), containers=good))
    try:
        for _ in range(5):
            assert attributor.resolve(fake_container.cgroup_id).status is (
                AttributionStatus.ATTRIBUTED
            )
        assert good.calls == 1
    finally:
        attributor.close()
    dead = StaticContainers({}, fail=True)
    attributor = started(Attributor(config=AttributorConfig(prefetch=False), containers=dead))
    try:
        for _ in range(5):
            attributor.resolve(fake_container.cgroup_id)
        assert dead.calls == 1
    finally:
        attributor.close()


def test_the_api_pod_cache_supplies_owner_and_init_or_ephemeral_container_names(
    fake_container: FakeContainer,
) -> None:
    pods = StaticPods(
        {
            fake_container.uid: PodMeta(
                uid=fake_container.uid,
                namespace="batch",
                name="report-28930110-x7k2p",
                workload=WorkloadRef("CronJob", "report"),
                containers={
                    fake_container.cid: ContainerMeta(
                        fake_container.cid,
                        "debugger-abc12",
                        "busybox:1.36",
                        ContainerRole.EPHEMERAL,
                    )
                },
                deleted=True,  # deleted from the API since: its names still hold
            )
        }
    )
    attributor = started(Attributor(containers=StaticContainers({}), pods=pods))
    try:
        got = attributor.resolve(fake_container.cgroup_id)
        assert got.status is AttributionStatus.ATTRIBUTED
        assert (got.namespace, got.pod, got.container) == (
            "batch",
            "report-28930110-x7k2p",
            "debugger-abc12",
        )
        assert (got.workload_kind, got.workload, got.image) == ("CronJob", "report", "busybox:1.36")
    finally:
        attributor.close()


def test_on_a_hybrid_host_a_live_task_outside_the_unified_tree_resolves_through_v1(
    root: None,
) -> None:
    """Runtimes that ignore the unified hierarchy leave every container in the v2 root."""
    mounts = cgroup_mounts()
    systemd_v1 = mounts.v1.get("name=systemd") or next(iter(mounts.v1.values()), None)
    if mounts.unified is None or systemd_v1 is None:
        raise AssertionError("this test needs a hybrid host (v1 and v2 mounted)")
    uid, cid = str(uuid.uuid4()), secrets.token_hex(32)
    pod_path = f"/kubepods/besteffort/pod{uid}"
    v1_dir = systemd_v1.to_fs_path(f"{pod_path}/{cid}")
    assert v1_dir is not None
    v1_dir.mkdir(parents=True)
    sleeper = subprocess.Popen(["sleep", "60"])
    attributor = started(Attributor(containers=StaticContainers({})))
    try:
        (v1_dir / "cgroup.procs").write_text(str(sleeper.pid))
        v2_root_id = mounts.unified.mountpoint.stat().st_ino

        got = attributor.resolve(v2_root_id, sleeper.pid)
        assert (got.pod_uid, got.container_id) == (uid, cid)
        assert got.cgroup_path == f"{pod_path}/{cid}"

        other_cgroup = 2**62 + 99  # the pid now lives elsewhere than the event said
        assert attributor.resolve(other_cgroup, sleeper.pid).pod_uid is None

        sleeper.kill()
        sleeper.wait()
        gone = attributor.resolve(v2_root_id, sleeper.pid)
        assert gone.status is AttributionStatus.HOST and gone.pod_uid is None
    finally:
        attributor.close()
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()
        remove_pod_cgroups(pod_path)
