"""The kubelet's and the runtimes' cgroup layouts, and what must never be mistaken for them."""

from __future__ import annotations

import pytest

from execwatch.attribution.cgroup_layout import (
    CgroupDriver,
    CgroupKind,
    CgroupLayout,
    QosClass,
    parse_cgroup_path,
)

UID = "5f1c7a9e-3b2d-4c8e-9a1f-0e6d2c4b8a7f"
UID_ = UID.replace("-", "_")
CID = "0123456789abcdef" * 4
STATIC_UID = "3b5a0b1e2f4c6d8e0a1b2c3d4e5f6a7b"


@pytest.mark.parametrize(
    ("path", "qos"),
    [
        (f"/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope", "guaranteed"),
        (
            f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice"
            f"/cri-containerd-{CID}.scope",
            "burstable",
        ),
        (
            f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice"
            f"/cri-containerd-{CID}.scope",
            "besteffort",
        ),
    ],
)
def test_systemd_driver_gives_pod_uid_with_dashes_qos_and_container(path: str, qos: str) -> None:
    got = parse_cgroup_path(path)
    assert got == CgroupLayout(
        kind=CgroupKind.KUBERNETES,
        path=path,
        driver=CgroupDriver.SYSTEMD,
        qos=QosClass(qos),
        pod_uid=UID,
        runtime="containerd",
        container_id=CID,
    )


@pytest.mark.parametrize(
    ("path", "qos"),
    [
        (f"/kubepods/pod{UID}/{CID}", "guaranteed"),
        (f"/kubepods/burstable/pod{UID}/{CID}", "burstable"),
        (f"/kubepods/besteffort/pod{UID}/{CID}", "besteffort"),
    ],
)
def test_cgroupfs_driver_gives_pod_uid_qos_and_container(path: str, qos: str) -> None:
    got = parse_cgroup_path(path)
    assert got.kind is CgroupKind.KUBERNETES
    assert got.driver is CgroupDriver.CGROUPFS
    assert got.qos is QosClass(qos)
    assert (got.pod_uid, got.container_id, got.runtime) == (UID, CID, None)


@pytest.mark.parametrize(
    ("prefix", "runtime", "monitor"),
    [
        ("cri-containerd", "containerd", False),
        ("crio", "cri-o", False),
        ("crio-conmon", "cri-o", True),
        ("docker", "docker", False),
    ],
)
def test_runtime_prefixes_of_systemd_scopes(prefix: str, runtime: str, monitor: bool) -> None:
    path = f"/kubepods.slice/kubepods-pod{UID_}.slice/{prefix}-{CID}.scope"
    got = parse_cgroup_path(path)
    assert (got.runtime, got.container_id, got.monitor) == (runtime, CID, monitor)
    assert got.pod_uid == UID


def test_crio_with_cgroupfs_prefixes_its_container_dirs() -> None:
    got = parse_cgroup_path(f"/kubepods/burstable/pod{UID}/crio-{CID}")
    assert (got.runtime, got.container_id, got.pod_uid) == ("cri-o", CID, UID)


def test_cgroups_nested_inside_a_container_belong_to_that_container() -> None:
    # crun places the payload in <scope>/container; systemd-in-a-pod makes its own tree.
    base = f"/kubepods.slice/kubepods-pod{UID_}.slice/crio-{CID}.scope"
    for sub in ("container", "init.scope", "system.slice/foo.service"):
        got = parse_cgroup_path(f"{base}/{sub}")
        assert (got.pod_uid, got.container_id) == (UID, CID)


# kind and similar nodes run the kubelet with --cgroup-root=/kubelet.
KIND_SYSTEMD = (
    "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice"
    f"/kubelet-kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope"
)
KIND_CGROUPFS = f"/kubelet/kubepods/besteffort/pod{UID}/{CID}"


def test_kubelet_under_a_custom_cgroup_root() -> None:
    for path in (KIND_SYSTEMD, KIND_CGROUPFS):
        got = parse_cgroup_path(path)
        assert (got.kind, got.pod_uid, got.container_id) == (CgroupKind.KUBERNETES, UID, CID)
        assert got.qos is QosClass.BESTEFFORT


def test_static_pod_uids_are_hashes_without_dashes() -> None:
    path = f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{STATIC_UID}.slice"
    got = parse_cgroup_path(path)
    assert (got.pod_uid, got.container_id) == (STATIC_UID, None)


def test_pod_and_qos_level_cgroups_name_what_they_can() -> None:
    pod = parse_cgroup_path(f"/kubepods/besteffort/pod{UID}")
    assert (pod.kind, pod.pod_uid, pod.container_id) == (CgroupKind.KUBERNETES, UID, None)
    qos = parse_cgroup_path("/kubepods.slice/kubepods-burstable.slice")
    assert (qos.kind, qos.qos, qos.pod_uid) == (CgroupKind.KUBERNETES, QosClass.BURSTABLE, None)
    assert parse_cgroup_path("/kubepods").pod_uid is None


def test_an_unrecognised_child_of_a_pod_keeps_the_pod_but_names_no_container() -> None:
    got = parse_cgroup_path(f"/kubepods/pod{UID}/not-a-container")
    assert (got.pod_uid, got.container_id) == (UID, None)


@pytest.mark.parametrize(
    "path",
    [
        # QoS of the pod slice contradicts its parent
        f"/kubepods.slice/kubepods-burstable.slice/kubepods-besteffort-pod{UID_}.slice/"
        f"cri-containerd-{CID}.scope",
        # a guaranteed pod slice under a QoS slice
        f"/kubepods.slice/kubepods-burstable.slice/kubepods-pod{UID_}.slice",
        # systemd-escaped UID in a cgroupfs path, and dashes in a systemd one
        f"/kubepods/besteffort/pod{UID_}/{CID}",
        f"/kubepods.slice/kubepods-pod{UID}.slice/cri-containerd-{CID}.scope",
        # truncated, empty and non-hex UIDs
        f"/kubepods/besteffort/pod{UID[:-4]}/{CID}",
        "/kubepods/besteffort/pod/" + CID,
        "/kubepods.slice/kubepods-pod.slice",
        f"/kubepods/besteffort/pod{UID.upper()}/{CID}",
        f"/kubepods/besteffort/podzzzzzzzz-3b2d-4c8e-9a1f-0e6d2c4b8a7f/{CID}",
        # an unknown QoS class
        f"/kubepods/gold/pod{UID}/{CID}",
        # path tricks
        f"/kubepods/besteffort/../pod{UID}/{CID}",
        f"/kubepods//pod{UID}/{CID}",
        f"/kubepods/ pod{UID}/{CID}",
        # not at the kubelet's cgroup root: a user's delegated tree (systemd
        # user@.service) may name its cgroups as it likes
        "/user.slice/user-1000.slice/user@1000.service/app.slice/kubepods.slice"
        f"/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope",
        "/user.slice/user-1000.slice/user@1000.service/user-kubepods.slice"
        f"/user-kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope",
        f"/x.slice/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope",
        f"/kubelet.slice/other-kubepods.slice/other-kubepods-pod{UID_}.slice",
        f"/user.slice/user-1000.slice/user@1000.service/kubepods/pod{UID}/{CID}",
        f"/system.slice/evil.service/kubepods/besteffort/pod{UID}/{CID}",
    ],
)
def test_malformed_kubernetes_paths_are_unknown_and_name_no_pod(path: str) -> None:
    got = parse_cgroup_path(path)
    assert got.kind is CgroupKind.UNKNOWN
    assert got.pod_uid is None and got.container_id is None
    assert got.path == path


@pytest.mark.parametrize(
    "leaf",
    [
        f"cri-containerd-{CID[:-1]}.scope",  # 63 hex digits
        f"cri-containerd-{CID}0.scope",  # 65
        f"cri-containerd-{CID.upper()}.scope",
        f"runsc-{CID}.scope",  # unknown runtime prefix
        f"cri-containerd-{CID}.slice",
    ],
)
def test_malformed_container_scopes_name_the_pod_but_no_container(leaf: str) -> None:
    got = parse_cgroup_path(f"/kubepods.slice/kubepods-pod{UID_}.slice/{leaf}")
    assert (got.pod_uid, got.container_id, got.runtime) == (UID, None, None)


def test_podman_and_docker_containers_outside_kubernetes() -> None:
    podman = parse_cgroup_path(f"/machine.slice/libpod-{CID}.scope")
    assert (podman.kind, podman.runtime, podman.container_id) == (
        CgroupKind.CONTAINER,
        "podman",
        CID,
    )
    rootless = parse_cgroup_path(
        f"/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{CID}.scope/container"
    )
    assert (rootless.runtime, rootless.container_id) == ("podman", CID)
    conmon = parse_cgroup_path(f"/machine.slice/libpod-conmon-{CID}.scope")
    assert conmon.monitor and conmon.container_id == CID
    docker = parse_cgroup_path(f"/system.slice/docker-{CID}.scope")
    assert (docker.kind, docker.runtime, docker.driver) == (
        CgroupKind.CONTAINER,
        "docker",
        CgroupDriver.SYSTEMD,
    )
    docker_fs = parse_cgroup_path(f"/docker/{CID}")
    assert (docker_fs.runtime, docker_fs.container_id, docker_fs.driver) == (
        "docker",
        CID,
        CgroupDriver.CGROUPFS,
    )
    assert parse_cgroup_path(f"/libpod_parent/libpod-{CID}").runtime == "podman"


def test_a_container_in_a_podman_pod_is_itself_not_its_pod() -> None:
    pod_id = "b" * 64
    cgroupfs = f"/libpod_parent/{pod_id}/libpod-{CID}"
    systemd = f"/machine.slice/machine-libpod_pod_{pod_id}.slice/libpod-{CID}.scope"
    for path in (cgroupfs, systemd):
        layout = parse_cgroup_path(path)
        assert (layout.kind, layout.runtime, layout.container_id) == (
            CgroupKind.CONTAINER, "podman", CID,
        ), path  # fmt: skip


def test_host_processes_get_their_systemd_unit() -> None:
    assert parse_cgroup_path("/") == CgroupLayout(CgroupKind.HOST, "/")
    assert parse_cgroup_path("").kind is CgroupKind.HOST
    svc = parse_cgroup_path("/system.slice/containerd.service")
    assert (svc.kind, svc.unit) == (CgroupKind.HOST, "containerd.service")
    session = parse_cgroup_path("/user.slice/user-1000.slice/session-3.scope")
    assert (session.kind, session.unit) == (CgroupKind.HOST, "session-3.scope")
    assert parse_cgroup_path("/init.scope").unit == "init.scope"
    escaped = parse_cgroup_path("/system.slice/system-getty.slice/getty@tty1.service")
    assert escaped.unit == "getty@tty1.service"


@pytest.mark.parametrize(
    "path",
    [
        "/process_api/39c1708fadff59ba98c003fd919b55ac",
        f"/{CID}",
        "/lxc/web01",
        "/docker/not-an-id",
        "garbage\x00",
        "/" + "a/" * 3000,
    ],
)
def test_anything_else_is_unknown_with_the_raw_path_kept(path: str) -> None:
    got = parse_cgroup_path(path)
    assert got.kind is CgroupKind.UNKNOWN
    assert got.pod_uid is None and got.container_id is None
    assert path.startswith(got.path[:100])


def test_a_configured_kubelet_cgroup_root_is_the_only_anchor() -> None:
    for path in (KIND_SYSTEMD, KIND_CGROUPFS):
        assert parse_cgroup_path(path, kubelet_root="/kubelet").pod_uid == UID
        assert parse_cgroup_path(path, kubelet_root="/").kind is CgroupKind.UNKNOWN
    top = f"/kubepods/pod{UID}/{CID}"
    assert parse_cgroup_path(top, kubelet_root="/").pod_uid == UID
    assert parse_cgroup_path(top, kubelet_root="/kubelet").kind is CgroupKind.UNKNOWN
