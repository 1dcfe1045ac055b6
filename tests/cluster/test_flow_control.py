"""The agents' requests run in their own API Priority and Fairness level.

The API server names the FlowSchema and priority level it classified a request into in
the X-Kubernetes-PF-* response headers: the real classifier, with the shipped objects.
"""

from __future__ import annotations

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from execwatch import crd
from tests.cluster.conftest import wait_until


def classified(api: client.ApiClient) -> tuple[str, str]:
    """(FlowSchema UID, PriorityLevel UID) of one list of records by `api`, whether the
    list is allowed or not (Priority and Fairness classifies before authorization)."""
    objects = client.CustomObjectsApi(api)
    try:
        _, _, headers = objects.list_namespaced_custom_object_with_http_info(
            crd.GROUP, crd.VERSION, crd.DEFAULT_NAMESPACE, crd.PLURAL
        )
    except ApiException as exc:
        headers = exc.headers
    return (
        headers.get("X-Kubernetes-PF-FlowSchema-UID", ""),
        headers.get("X-Kubernetes-PF-PriorityLevel-UID", ""),
    )


def uids(admin: client.ApiClient) -> tuple[str, str]:
    flow = client.FlowcontrolApiserverV1Api(admin)
    schema = flow.read_flow_schema("execwatch-agents")
    level = flow.read_priority_level_configuration("execwatch-agents")
    return schema.metadata.uid, level.metadata.uid


def test_agent_requests_are_classified_into_the_agents_level(
    agent_api: client.ApiClient, admin: client.ApiClient
) -> None:
    ours = uids(admin)
    wait_until(lambda: classified(agent_api) == ours, timeout=15)


def test_other_clients_are_not(handler_api: client.ApiClient, admin: client.ApiClient) -> None:
    ours = uids(admin)
    wait_until(lambda: classified(handler_api) != ("", ""), timeout=15)
    schema, level = classified(handler_api)
    assert schema != ours[0] and level != ours[1]
