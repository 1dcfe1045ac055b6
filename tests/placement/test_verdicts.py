"""ImageVerdict objects on the real API server: the schema, the merge of scan verdicts
and of sightings (scoped to a namespace and owner, bounded), and concurrent writers."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from execwatch.placement.verdicts import (
    GROUP,
    MAX_SIGHTINGS,
    PLURAL,
    VERSION,
    PlatformVerdict,
    Sighting,
    VerdictStore,
    object_name,
)
from execwatch.runnable.verdict import Outcome
from tests.placement.cluster import rest_for
from tests.support.kube.apiserver import KubeCluster, apply

CRD = Path(__file__).resolve().parents[2] / "deploy" / "placement" / "imageverdict-crd.yaml"
DIGEST = "sha256:" + "ab" * 32
T = "2026-12-03T12:00:00Z"


def scan(platform: str, outcome: Outcome, *why: str) -> PlatformVerdict:
    return PlatformVerdict(platform, outcome, "scan", T, why, len(why))


@pytest.fixture(scope="module")
def crd(kube: KubeCluster) -> None:
    with kube.client() as api:
        apply(api, [yaml.safe_load(CRD.read_text())])


@pytest.fixture
def store(crd: None, admin: client.ApiClient) -> Iterator[VerdictStore]:
    """A store on a cluster with no verdict: other tests' (the real command's, the
    handler's) are cluster-scoped and would count here."""
    delete_all_verdicts(admin)
    yield VerdictStore(rest_for(admin), time.time)
    delete_all_verdicts(admin)


def delete_all_verdicts(admin: client.ApiClient) -> None:
    custom = client.CustomObjectsApi(admin)
    for item in custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)["items"]:
        custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, item["metadata"]["name"])


def test_kubectl_get_shows_where_an_image_runs(
    store: VerdictStore, admin: client.ApiClient
) -> None:
    store.record(
        DIGEST,
        "r.example/app:1",
        [scan("linux/amd64", Outcome.RUNS), scan("linux/arm64", Outcome.FAILS, "/app is x86-64")],
    )

    answer = admin.call_api(
        f"/apis/{GROUP}/{VERSION}/{PLURAL}",
        "GET",
        header_params={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"},
        auth_settings=["BearerToken"],
        _preload_content=False,
        _return_http_data_only=True,
    )
    table = json.loads(answer.data)  # what `kubectl get imageverdicts` prints
    columns = [c["name"] for c in table["columnDefinitions"]]
    [row] = table["rows"]
    cells = dict(zip(columns, row["cells"], strict=True))
    assert (cells["Name"], cells["Image"]) == (object_name(DIGEST), "r.example/app:1")
    assert (cells["Runs"], cells["Fails"]) == ("linux/amd64", "linux/arm64")
    got = store.get(DIGEST)
    assert got is not None and got.platforms["linux/arm64"].why == ("/app is x86-64",)


def sighting(namespace: str, path: str = "/opt/tool", time: str = T) -> Sighting:
    return Sighting("linux/arm64", namespace, "ReplicaSet/app-1", path, time, "exec format", 1)


def test_sightings_are_kept_apart_from_scans_per_namespace_owner_and_path(
    store: VerdictStore,
) -> None:
    store.record(DIGEST, "r/app:1", [scan("linux/arm64", Outcome.RUNS)])
    store.record(DIGEST, "r/app:1", [], [sighting("team-a"), sighting("team-b")])
    later = sighting("team-a", time="2026-12-03T13:00:00Z")
    store.record(DIGEST, "r/app:1", [scan("linux/amd64", Outcome.RUNS)], [later])

    got = store.get(DIGEST)
    assert got is not None
    assert {p: v.outcome for p, v in got.platforms.items()} == {
        "linux/arm64": Outcome.RUNS, "linux/amd64": Outcome.RUNS,
    }  # fmt: skip
    assert set(got.observed) == {later, sighting("team-b")}


def test_the_newest_sightings_are_kept_within_the_bound(store: VerdictStore) -> None:
    many = [
        sighting("team", f"/tmp/x{i}", f"2026-12-03T12:{i // 60:02d}:{i % 60:02d}Z")
        for i in range(MAX_SIGHTINGS + 5)
    ]
    for start in range(0, len(many), 8):
        store.record(DIGEST, "r/app:1", [], many[start : start + 8])

    got = store.get(DIGEST)
    assert got is not None and set(got.observed) == set(many[5:])


def test_concurrent_writers_merge_instead_of_overwriting(store: VerdictStore) -> None:
    platforms = [f"linux/arch{i}" for i in range(8)]
    threads = [
        threading.Thread(target=store.record, args=(DIGEST, "r/app:1", [scan(p, Outcome.RUNS)]))
        for p in platforms
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    got = store.get(DIGEST)
    assert got is not None and sorted(got.platforms) == platforms


@pytest.mark.parametrize(
    "bad",
    [
        {"spec": {"digest": "sha256:xyz"}},
        {"spec": {"digest": DIGEST}, "status": {"platforms": [
            {"platform": "linux/arm64", "outcome": "maybe", "source": "scan", "time": T}]}},
        {"spec": {"digest": DIGEST}, "status": {"platforms": [
            {"platform": "linux/arm64", "outcome": "runs", "source": "scan", "time": T,
             "why": ["x"] * 9}]}},
        {"spec": {"digest": DIGEST}, "status": {"observed": [
            {"platform": "linux/arm64", "namespace": "a", "owner": "Pod/p", "time": T}]}},
        {"spec": {"digest": DIGEST}, "status": {"observed": [
            {"platform": "linux/arm64", "namespace": "a", "owner": "Pod/p", "path": "/x",
             "time": T}] * 33}},
    ],
)  # fmt: skip
def test_the_schema_refuses_what_no_writer_of_ours_writes(
    store: VerdictStore, admin: client.ApiClient, bad: dict[str, object]
) -> None:
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ImageVerdict",
            "metadata": {"name": object_name(DIGEST)}, **bad}  # fmt: skip
    with pytest.raises(ApiException) as refused:
        client.CustomObjectsApi(admin).create_cluster_custom_object(GROUP, VERSION, PLURAL, body)
    assert refused.value.status == 422


def test_names_come_only_from_sha256_digests() -> None:
    assert object_name(DIGEST) == "sha256-" + "ab" * 32
    for bad in ("sha256:../../x", "sha512:" + "a" * 128, DIGEST + "\n", DIGEST.upper()):
        with pytest.raises(ValueError):
            object_name(bad)
