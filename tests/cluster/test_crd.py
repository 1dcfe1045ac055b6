"""The ExecFailure CRD: the whole record in one create, validated by the API server."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from execwatch import crd
from execwatch.record import Reason
from tests.cluster.conftest import NODE
from tests.support.agent.exec_failures import exec_failure

ARGS = (crd.GROUP, crd.VERSION, crd.DEFAULT_NAMESPACE, crd.PLURAL)


def body(name: str = "crd-1", **spec: Any) -> dict[str, Any]:
    pod = {"metadata": {"name": "web-0", "namespace": "shop", "uid": "0b7e-uid"}}
    doc = crd.to_body(
        exec_failure(pod=pod, count=3),
        name=name,
        namespace=crd.DEFAULT_NAMESPACE,
        node=NODE,
        first_seen=1_700_000_000.25,
        last_seen=1_700_000_009.5,
        count=3,
    )
    doc["spec"].update(spec)
    return doc


def create(admin: client.ApiClient, doc: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = client.CustomObjectsApi(admin).create_namespaced_custom_object(
        *ARGS, doc
    )
    return result


def rejected(admin: client.ApiClient, doc: dict[str, Any]) -> str:
    with pytest.raises(ApiException) as err:
        create(admin, doc)
    assert err.value.status == 422, err.value.body
    return str(err.value.body)


def test_one_create_carries_the_full_record(admin: client.ApiClient) -> None:
    stored = create(admin, body())
    spec = stored["spec"]
    assert spec["node"] == NODE and spec["nodeArch"] == "amd64"
    assert spec["errno"] == "ENOEXEC" and spec["reason"] == "ForeignArchitecture"
    assert spec["path"] == "/usr/local/bin/server" and spec["binaryArch"] == "arm64"
    assert spec["interpreter"] == "/lib/ld-linux-aarch64.so.1"
    assert spec["comm"] == "runc:[2:INIT]"
    assert spec["pod"] == {"name": "web-0", "namespace": "shop", "uid": "0b7e-uid"}
    assert spec["container"]["name"] == "app" and len(spec["container"]["id"]) == 64
    assert spec["workload"] == {"kind": "Deployment", "name": "app"}
    assert spec["firstSeen"].startswith("2023-11-14T22:13:20.25")
    assert spec["lastSeen"].startswith("2023-11-14T22:13:29.5")
    assert spec["count"] == 3
    parsed = crd.parse(stored)
    assert parsed.reason is Reason.FOREIGN_ARCHITECTURE and parsed.count == 3


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"count": 0}, "count"),
        ({"reason": "Bogus"}, "reason"),
        ({"errno": "enoexec; rm -rf"}, "errno"),
        ({"path": "/" + "a" * 4096}, "path"),
        ({"nodeArch": "x" * 33}, "nodeArch"),
        ({"firstSeen": "2030-01-01T00:00:00Z"}, "firstSeen must not be after lastSeen"),
        ({"lastSeen": "yesterday"}, "lastSeen"),
        ({"pod": {"name": "p", "namespace": "n" * 64}}, "namespace"),
    ],
)
def test_malformed_or_oversized_records_are_refused(
    admin: client.ApiClient, change: dict[str, Any], message: str
) -> None:
    assert message in rejected(admin, body(**change))


def test_a_record_without_required_fields_is_refused(admin: client.ApiClient) -> None:
    doc = body()
    for field in ("node", "path", "count", "firstSeen"):
        broken = copy.deepcopy(doc)
        del broken["spec"][field]
        assert field in rejected(admin, broken)


def test_a_record_cannot_be_rewritten_after_its_create(admin: client.ApiClient) -> None:
    create(admin, body("crd-frozen"))
    with pytest.raises(ApiException) as err:
        client.CustomObjectsApi(admin).patch_namespaced_custom_object(
            *ARGS,
            "crd-frozen",
            {"spec": {"count": 99}},
        )
    assert err.value.status == 422
    assert "written once" in str(err.value.body)


def set_quota_usage(admin: client.ApiClient, used: int) -> None:
    """Play the quota controller (not running here): publish hard and used counts."""
    key = "count/execfailures.execwatch.io"
    client.CoreV1Api(admin).patch_namespaced_resource_quota_status(
        "execwatch-records",
        crd.DEFAULT_NAMESPACE,
        {"status": {"hard": {key: "5k"}, "used": {key: str(used)}}},
    )


def test_the_resource_quota_caps_the_number_of_records(admin: client.ApiClient) -> None:
    quota = client.CoreV1Api(admin).read_namespaced_resource_quota(
        "execwatch-records", crd.DEFAULT_NAMESPACE
    )
    assert quota.spec.hard == {"count/execfailures.execwatch.io": "5k"}
    set_quota_usage(admin, 4999)
    try:
        create(admin, body("crd-last-one"))
        with pytest.raises(ApiException) as err:
            create(admin, body("crd-one-too-many"))
        assert err.value.status == 403
        assert "exceeded quota" in str(err.value.body)
    finally:
        set_quota_usage(admin, 0)
