"""What an agent may put in an ExecFailure's metadata: the real admission chain decides.

The CRD schema bounds the spec, but metadata is free-form to the API server: without the
shipped ValidatingAdmissionPolicy `execwatch-agent-record-metadata`, a compromised agent
could fill the records quota with 256 KiB annotations (about 1.3 GB of etcd) or pin records
with finalizers. The agent here uses a real pod-bound token, as the kubelet mounts it.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from execwatch import crd
from tests.cluster.conftest import list_records, wait_until
from tests.support.agent.exec_failures import exec_failure
from tests.support.kube.apiserver_fixtures import AGENT_NODE


def record(name: str | None = None) -> dict[str, Any]:
    """A record exactly as the publisher builds it (crd.to_body)."""
    return crd.to_body(
        exec_failure(),
        name=name or crd.record_name(AGENT_NODE, uuid.uuid4().hex, 1),
        namespace=crd.DEFAULT_NAMESPACE,
        node=AGENT_NODE,
        first_seen=1.7e9,
        last_seen=1.7e9,
        count=1,
    )


def create(api: client.ApiClient, body: dict[str, Any]) -> int:
    """The HTTP status of creating `body`."""
    try:
        client.CustomObjectsApi(api).create_namespaced_custom_object(
            crd.GROUP, crd.VERSION, crd.DEFAULT_NAMESPACE, crd.PLURAL, body
        )
    except ApiException as exc:
        return int(exc.status)
    return 201


def with_metadata(**meta: Any) -> dict[str, Any]:
    body = record()
    body["metadata"].update(meta)
    return body


def big_field_set(manager: str) -> dict[str, Any]:
    """A managedFields entry the API server stores as sent: 20,000 made-up fields (300 KB)."""
    return {
        "manager": manager,
        "operation": "Update",
        "apiVersion": f"{crd.GROUP}/{crd.VERSION}",
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:spec": {f"f:x{i}": {} for i in range(20000)}},
    }


@pytest.fixture
def enforced(agent_api: client.ApiClient) -> client.ApiClient:
    """The agent's client, once the API server's policy informer has seen the policy."""
    wait_until(lambda: create(agent_api, with_metadata(annotations={"a": "b"})) == 403)
    return agent_api


def test_a_record_as_the_publisher_builds_it_is_admitted(
    enforced: client.ApiClient, admin: client.ApiClient
) -> None:
    body = record()
    assert create(enforced, body) == 201
    (stored,) = list_records(admin)
    assert stored["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "execwatch-agent"}
    assert stored["metadata"]["name"] == body["metadata"]["name"]


@pytest.mark.parametrize(
    "meta",
    [
        {"annotations": {"filler": "x" * 255 * 1024}},  # the quota-filling record
        {"annotations": {"a": ""}},
        {"labels": {"app.kubernetes.io/managed-by": "execwatch-agent", "team": "x"}},
        {"labels": {"app.kubernetes.io/managed-by": "someone-else"}},
        {"finalizers": ["execwatch.io/never"]},
        {
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": str(uuid.uuid4())}
            ]
        },
        {"name": "node-a-" + "a" * 100},
        {"managedFields": [big_field_set("OpenAPI-Generator")]},  # merged with its own
        {"managedFields": [big_field_set(f"m{i}") for i in range(3)]},
    ],
    ids=[
        "256KiB-annotation",
        "any-annotation",
        "extra-label",
        "other-label-value",
        "finalizer",
        "owner",
        "long-name",
        "managed-fields-of-its-own-manager",
        "managed-fields-entries",
    ],
)
def test_an_agent_cannot_add_metadata_beyond_what_the_publisher_sets(
    enforced: client.ApiClient, admin: client.ApiClient, meta: dict[str, Any]
) -> None:
    assert create(enforced, with_metadata(**meta)) == 403
    assert list_records(admin) == []


def test_a_record_without_labels_is_still_admitted(enforced: client.ApiClient) -> None:
    body = record()
    del body["metadata"]["labels"]
    assert create(enforced, body) == 201


def test_other_identities_are_not_bound_by_the_agents_rules(admin: client.ApiClient) -> None:
    """An administrator may annotate a record (kubectl annotate while investigating)."""
    assert create(admin, with_metadata(annotations={"note": "seen"})) == 201
