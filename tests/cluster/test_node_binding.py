"""A node speaks only for itself: the real admission chain refuses forged records.

Agents on two nodes use real bound ServiceAccount tokens, each bound to an agent pod on
its node, as the kubelet mounts them. The API server derives the caller's node from the
token; the shipped ValidatingAdmissionPolicy `execwatch-agent-own-node` compares it with
the record's spec.node.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from execwatch import crd
from execwatch.agent.records import RecordApi
from execwatch.kube import errors
from tests.cluster.conftest import list_records
from tests.support.agent.exec_failures import exec_failure
from tests.support.kube.apiserver import KubeCluster
from tests.support.kube.apiserver_fixtures import AGENT_SA
from tests.support.wait import wait_until

NODES = ("node-east", "node-west")


def record(node: str) -> dict[str, object]:
    return crd.to_body(
        exec_failure(),
        name=f"{node}-{uuid.uuid4().hex[:16]}",
        namespace=crd.DEFAULT_NAMESPACE,
        node=node,
        first_seen=1.7e9,
        last_seen=1.7e9,
        count=1,
    )


@pytest.fixture
def agents(kube: KubeCluster) -> Iterator[dict[str, RecordApi]]:
    """An agent on each node, with its own pod-bound token and its own client."""
    apis = {node: kube.rest(kube.node_token(*AGENT_SA, node)) for node in NODES}
    yield {node: RecordApi(api, crd.DEFAULT_NAMESPACE) for node, api in apis.items()}
    for api in apis.values():
        api.close()


def refused(sink: RecordApi, body: dict[str, Any]) -> errors.ApiError | None:
    try:
        sink.create(body)
    except errors.ApiError as err:
        return err
    return None


def test_an_agent_reports_for_its_own_node_and_is_refused_for_another(
    agents: dict[str, RecordApi], admin: client.ApiClient
) -> None:
    east, west = agents["node-east"], agents["node-west"]
    # The policy is enforced once the API server's policy informer has seen it.
    wait_until(lambda: refused(east, record("node-west")) is not None, timeout=15)

    east.create(record("node-east"))
    west.create(record("node-west"))
    for sink, other in ((east, "node-west"), (west, "node-east"), (east, "node-a")):
        err = refused(sink, record(other))
        assert err is not None and err.status == 403
        assert isinstance(err, errors.PermanentError)
        assert "own node" in str(err)
    assert sorted(r["spec"]["node"] for r in list_records(admin)) == sorted(NODES)


def test_a_token_not_bound_to_a_pod_cannot_create_records(
    kube: KubeCluster, agents: dict[str, RecordApi], admin: client.ApiClient
) -> None:
    """A plain ServiceAccount token (not minted for an agent pod) names no node."""
    wait_until(lambda: refused(agents["node-east"], record("node-west")) is not None, timeout=15)
    with kube.rest(kube.service_account_token(*AGENT_SA)) as api:
        err = refused(RecordApi(api, crd.DEFAULT_NAMESPACE), record("node-east"))
    assert err is not None and err.status == 403
    assert list_records(admin) == []


def test_a_token_outlives_its_pod_only_until_the_pod_is_gone(
    kube: KubeCluster, admin: client.ApiClient
) -> None:
    """Deleting the agent pod invalidates its bound token: a stolen token of a deleted
    agent pod is refused by authentication before admission."""
    node = f"node-{uuid.uuid4().hex[:6]}"
    with kube.rest(kube.node_token(*AGENT_SA, node)) as api:
        sink = RecordApi(api, crd.DEFAULT_NAMESPACE)
        sink.create(record(node))
        client.CoreV1Api(admin).delete_namespaced_pod(
            f"{AGENT_SA[1]}-{node}", AGENT_SA[0], grace_period_seconds=0
        )

        def rejected() -> bool:
            err = refused(sink, record(node))
            return err is not None and err.status == 401

        wait_until(rejected, timeout=15)


def test_the_handler_and_other_identities_are_not_agents(
    handler_api: client.ApiClient,
) -> None:
    with pytest.raises(ApiException) as exc:
        client.CustomObjectsApi(handler_api).create_namespaced_custom_object(
            crd.GROUP, crd.VERSION, crd.DEFAULT_NAMESPACE, crd.PLURAL, record("node-east")
        )
    assert exc.value.status == 403  # RBAC: the handler has no create
