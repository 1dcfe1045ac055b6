"""Workload owners from labels and owner references, the API pod cache, /proc/PID/cgroup."""

from __future__ import annotations

from typing import Any

import pytest

from execwatch.attribution.kube import KubernetesPodCache
from execwatch.attribution.metadata import (
    ContainerRole,
    WorkloadRef,
    workload_from_labels,
    workload_from_owner,
)
from execwatch.attribution.procfs import parse_proc_cgroup


@pytest.mark.parametrize(
    ("pod", "labels", "expected"),
    [
        (
            "web-7d4b9c8f5-x2x9q",
            {"pod-template-hash": "7d4b9c8f5"},
            WorkloadRef("Deployment", "web"),
        ),
        (
            "my-api-v2-66b8d7c9f-abcde",
            {"pod-template-hash": "66b8d7c9f"},
            WorkloadRef("Deployment", "my-api-v2"),
        ),
        (
            "db-12",
            {"controller-revision-hash": "db-5c9d8", "statefulset.kubernetes.io/pod-name": "db-12"},
            WorkloadRef("StatefulSet", "db"),
        ),
        (
            "fluentd-k8n2q",
            {"controller-revision-hash": "7f9c", "pod-template-generation": "3"},
            WorkloadRef("DaemonSet", "fluentd"),
        ),
        (
            "backup-x-abcde",
            {"batch.kubernetes.io/job-name": "backup-x"},
            WorkloadRef("Job", "backup-x"),
        ),
        ("old-job-abcde", {"job-name": "old-job"}, WorkloadRef("Job", "old-job")),
    ],
)
def test_controllers_labels_name_the_workload(
    pod: str, labels: dict[str, str], expected: WorkloadRef
) -> None:
    assert workload_from_labels(pod, labels) == expected


@pytest.mark.parametrize(
    ("pod", "labels"),
    [
        ("web-7d4b9c8f5-x2x9q", {}),  # a bare pod that merely looks like a Deployment's
        ("web-x2x9q", {"pod-template-hash": "7d4b9c8f5"}),  # hash not in the name
        ("web-7d4b9c8f5-TOOLONG", {"pod-template-hash": "7d4b9c8f5"}),
        ("db", {"controller-revision-hash": "x", "statefulset.kubernetes.io/pod-name": "db"}),
        ("x", {"controller-revision-hash": "x"}),
    ],
)
def test_no_workload_is_guessed_without_a_controller_label_that_fits(
    pod: str, labels: dict[str, str]
) -> None:
    assert workload_from_labels(pod, labels) is None
    assert workload_from_labels(None, labels) is None


def test_owner_references_are_followed_to_the_top_level_workload() -> None:
    labels = {"pod-template-hash": "7d4b9c8f5"}
    assert workload_from_owner("ReplicaSet", "web-7d4b9c8f5", labels) == WorkloadRef(
        "Deployment", "web"
    )
    parents = {("Job", "report-28930110"): WorkloadRef("CronJob", "report")}
    assert workload_from_owner("Job", "report-28930110", {}, parents) == WorkloadRef(
        "CronJob", "report"
    )
    standalone = {("Job", "once"): None}
    assert workload_from_owner("Job", "once", {}, standalone) == WorkloadRef("Job", "once")
    assert workload_from_owner("ReplicaSet", "bare-rs", {}) == WorkloadRef("ReplicaSet", "bare-rs")
    assert workload_from_owner("DaemonSet", "fluentd", {}) == WorkloadRef("DaemonSet", "fluentd")
    assert workload_from_owner(None, None, {}) is None


def test_proc_cgroup_lines_give_the_unified_and_v1_paths() -> None:
    text = (
        "12:pids:/kubepods/besteffort/podx/abc\n"
        "4:cpu,cpuacct:/kubepods/besteffort/podx/abc\n"
        "1:name=systemd:/kubepods/besteffort/podx/abc\n"
        "0::/\n"
        "garbage\n"
    )
    parsed = parse_proc_cgroup(text)
    assert parsed.unified == "/"
    assert parsed.v1["cpuacct"] == "/kubepods/besteffort/podx/abc"
    assert parsed.v1_paths() == ["/kubepods/besteffort/podx/abc"]
    assert parse_proc_cgroup("0::/system.slice/x.service\n").v1 == {}


def ref(kind: str, name: str, controller: bool = True) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": kind, "name": name, "uid": name, "controller": controller}


def k8s_pod(
    uid: str,
    name: str,
    owner: dict[str, Any] | None = None,
    labels: dict[str, str] | None = None,
    **statuses: list[tuple[str, str, str]],
) -> dict[str, Any]:
    """A Pod as the API's JSON carries it."""

    def cs(items: list[tuple[str, str, str]]) -> list[dict[str, Any]]:
        return [
            {"name": n, "containerID": c, "image": i, "imageID": "", "ready": True,
             "restartCount": 0}
            for n, c, i in items
        ]  # fmt: skip

    return {
        "metadata": {
            "uid": uid,
            "name": name,
            "namespace": "shop",
            "labels": labels or {},
            "ownerReferences": [owner] if owner else [],
        },
        "status": {
            "containerStatuses": cs(statuses.get("regular", [])),
            "initContainerStatuses": cs(statuses.get("init", [])),
            "ephemeralContainerStatuses": cs(statuses.get("ephemeral", [])),
        },
    }


class FakeRest:
    """The one call of the client the cache makes itself: a GET of a ReplicaSet or Job
    (the list + watch is kube.watch's, against the real API server in
    tests/cluster/test_end_to_end.py)."""

    def __init__(self, owners: dict[str, dict[str, Any] | None] | None = None) -> None:
        self.owners, self.paths = owners or {}, list[str]()

    def call(self, method: str, path: str, **_: Any) -> dict[str, Any]:
        self.paths.append(f"{method} {path}")
        name = path.rsplit("/", 1)[1]
        parent = self.owners[name]
        return {"metadata": {"name": name, "ownerReferences": [parent] if parent else []}}


def test_the_pod_cache_knows_container_roles_owners_and_remembers_deleted_pods() -> None:
    api = FakeRest(
        {"web-7d4b9c8f5": ref("Deployment", "web"), "report-28930110": ref("CronJob", "report")}
    )
    cache = KubernetesPodCache("node-1", rest=api)
    web = k8s_pod(
        "u1",
        "web-7d4b9c8f5-x2x9q",
        ref("ReplicaSet", "web-7d4b9c8f5"),
        regular=[("app", "containerd://" + "a" * 64, "shop/web:3")],
        init=[("migrate", "containerd://" + "b" * 64, "shop/migrate:3")],
        ephemeral=[("debugger-xyz", "containerd://" + "c" * 64, "busybox")],
    )
    job = k8s_pod("u2", "report-28930110-k2p7q", ref("Job", "report-28930110"))
    cache.apply("ADDED", web)
    cache.apply("ADDED", job)
    cache.apply("MODIFIED", web)

    got = cache.pod("u1")
    assert got is not None and got.workload == WorkloadRef("Deployment", "web")
    assert {c.name: c.role for c in got.containers.values()} == {
        "app": ContainerRole.REGULAR,
        "migrate": ContainerRole.INIT,
        "debugger-xyz": ContainerRole.EPHEMERAL,
    }
    assert got.containers["a" * 64].image == "shop/web:3"
    job_meta = cache.pod("u2")
    assert job_meta is not None and job_meta.workload == WorkloadRef("CronJob", "report")
    assert api.paths == [  # each owner read once, then cached
        "GET /apis/apps/v1/namespaces/shop/replicasets/web-7d4b9c8f5",
        "GET /apis/batch/v1/namespaces/shop/jobs/report-28930110",
    ]

    cache.apply("DELETED", web)
    gone = cache.pod("u1")
    assert gone is not None and gone.deleted and gone.name == "web-7d4b9c8f5-x2x9q"
    cache.apply("BOOKMARK", k8s_pod("u3", "bookmark"))
    assert cache.pod("u3") is None


def test_tombstones_are_bounded() -> None:
    cache = KubernetesPodCache("node-1", rest=FakeRest(), tombstones=10)
    for i in range(100):
        pod = k8s_pod(f"u{i}", f"p{i}")
        cache.apply("ADDED", pod)
        cache.apply("DELETED", pod)
    assert cache.pod("u0") is None
    assert cache.pod("u99") is not None
    assert len(cache._tombstones) == 10


def test_a_full_listing_buries_the_pods_it_no_longer_names() -> None:
    """The watch's sink: a relist (after a 410 or a resync) is a full snapshot."""
    cache = KubernetesPodCache("node-7", rest=FakeRest())
    cache.listing()
    cache.upsert(k8s_pod("u1", "a"))
    cache.upsert(k8s_pod("u2", "b"))
    assert cache.pod("u1") is None and not cache.synced.is_set()  # not until it is whole
    cache.listed()
    assert cache.synced.is_set()
    cache.upsert(k8s_pod("u3", "c"))  # a watch event
    cache.delete(k8s_pod("u2", "b"))
    cache.listing()
    cache.upsert(k8s_pod("u3", "c"))
    cache.listed()
    a, b, c = cache.pod("u1"), cache.pod("u2"), cache.pod("u3")
    assert a is not None and a.deleted and b is not None and b.deleted
    assert c is not None and not c.deleted
