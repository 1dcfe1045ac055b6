"""The shipped RBAC is least privilege: each identity can do its job and nothing else.

Every assertion is a real request made with the ServiceAccount's own token; a denial is
the API server's 403, not a SelfSubjectAccessReview guess.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from execwatch import crd
from execwatch.agent.records import RecordApi
from tests.cluster.conftest import NODE, PodFactory, list_records, wait_until
from tests.support.agent.exec_failures import exec_failure


def _record(name: str, namespace: str = crd.DEFAULT_NAMESPACE) -> dict[str, Any]:
    return crd.to_body(
        exec_failure(),
        name=name,
        namespace=namespace,
        node=NODE,
        first_seen=1.0e9,
        last_seen=1.0e9,
        count=1,
    )


def denied(call: Callable[[], Any]) -> int:
    with pytest.raises(ApiException) as err:
        call()
    return int(err.value.status)


def test_agent_can_create_records_in_the_execwatch_namespace(
    agent_rest: Any, admin: client.ApiClient
) -> None:
    RecordApi(agent_rest, crd.DEFAULT_NAMESPACE).create(_record("rbac-ok"))
    assert [r["metadata"]["name"] for r in list_records(admin)] == ["rbac-ok"]


def test_agent_cannot_read_change_or_delete_records(
    agent_api: client.ApiClient, agent_rest: Any, admin: client.ApiClient
) -> None:
    RecordApi(agent_rest, crd.DEFAULT_NAMESPACE).create(_record("rbac-one"))
    custom = client.CustomObjectsApi(agent_api)
    args = (crd.GROUP, crd.VERSION, crd.DEFAULT_NAMESPACE, crd.PLURAL)
    assert denied(lambda: custom.list_namespaced_custom_object(*args)) == 403
    assert denied(lambda: custom.get_namespaced_custom_object(*args, "rbac-one")) == 403
    assert denied(lambda: custom.delete_namespaced_custom_object(*args, "rbac-one")) == 403
    assert (
        denied(
            lambda: custom.patch_namespaced_custom_object(*args, "rbac-one", {"spec": {"count": 9}})
        )
        == 403
    )


def test_agent_cannot_write_records_in_other_namespaces(
    agent_api: client.ApiClient, namespace: str
) -> None:
    custom = client.CustomObjectsApi(agent_api)
    assert (
        denied(
            lambda: custom.create_namespaced_custom_object(
                crd.GROUP, crd.VERSION, namespace, crd.PLURAL, _record("x", namespace)
            )
        )
        == 403
    )
    assert (
        denied(
            lambda: custom.create_namespaced_custom_object(
                crd.GROUP, crd.VERSION, "default", crd.PLURAL, _record("x", "default")
            )
        )
        == 403
    )


def test_agent_cannot_touch_pods_events_or_secrets(
    agent_api: client.ApiClient, make_pod: PodFactory, namespace: str
) -> None:
    pod = make_pod()
    name = pod["metadata"]["name"]
    core = client.CoreV1Api(agent_api)
    assert denied(lambda: core.read_namespaced_pod(name, namespace)) == 403
    assert denied(lambda: core.list_pod_for_all_namespaces()) == 403
    assert (
        denied(
            lambda: core.patch_namespaced_pod(name, namespace, {"metadata": {"labels": {"x": "y"}}})
        )
        == 403
    )
    assert denied(lambda: core.delete_namespaced_pod(name, namespace)) == 403
    assert denied(lambda: core.list_namespaced_secret(crd.DEFAULT_NAMESPACE)) == 403
    assert denied(lambda: client.EventsV1Api(agent_api).list_namespaced_event(namespace)) == 403


def test_handler_can_consume_records_and_act_on_pods(
    handler_api: client.ApiClient,
    agent_rest: Any,
    make_pod: PodFactory,
    namespace: str,
) -> None:
    RecordApi(agent_rest, crd.DEFAULT_NAMESPACE).create(_record("rbac-h"))
    custom = client.CustomObjectsApi(handler_api)
    args = (crd.GROUP, crd.VERSION, crd.DEFAULT_NAMESPACE, crd.PLURAL)
    assert [
        r["metadata"]["name"] for r in custom.list_namespaced_custom_object(*args)["items"]
    ] == ["rbac-h"]
    custom.delete_namespaced_custom_object(*args, "rbac-h")
    pod = make_pod()
    core = client.CoreV1Api(handler_api)
    core.read_namespaced_pod(pod["metadata"]["name"], namespace)
    core.patch_namespaced_pod(
        pod["metadata"]["name"],
        namespace,
        {"metadata": {"labels": {"execwatch.io/exec-failure": "x"}}},
        _content_type="application/merge-patch+json",
    )


def test_handler_cannot_read_secrets_delete_or_replace_pods_or_forge_records(
    handler_api: client.ApiClient, make_pod: PodFactory, namespace: str
) -> None:
    pod = make_pod()
    name = pod["metadata"]["name"]
    core = client.CoreV1Api(handler_api)
    assert denied(lambda: core.list_namespaced_secret(crd.DEFAULT_NAMESPACE)) == 403
    assert denied(lambda: core.read_namespaced_secret("any", namespace)) == 403
    assert denied(lambda: core.list_secret_for_all_namespaces()) == 403
    assert denied(lambda: core.delete_namespaced_pod(name, namespace)) == 403
    assert denied(lambda: core.replace_namespaced_pod(name, namespace, pod)) == 403
    assert denied(lambda: core.list_namespaced_pod(namespace)) == 403
    assert (
        denied(
            lambda: client.CustomObjectsApi(handler_api).create_namespaced_custom_object(
                crd.GROUP, crd.VERSION, crd.DEFAULT_NAMESPACE, crd.PLURAL, _record("forged")
            )
        )
        == 403
    )


def test_handler_lease_rights_are_limited_to_its_own_lease(handler_api: client.ApiClient) -> None:
    coord = client.CoordinationV1Api(handler_api)
    other_name = f"someone-else-{uuid.uuid4().hex[:6]}"
    other = client.V1Lease(
        metadata=client.V1ObjectMeta(name=other_name), spec=client.V1LeaseSpec(holder_identity="x")
    )
    coord.create_namespaced_lease(crd.DEFAULT_NAMESPACE, other)  # create cannot be name-scoped
    assert denied(lambda: coord.read_namespaced_lease(other_name, crd.DEFAULT_NAMESPACE)) == 403
    assert denied(lambda: coord.delete_namespaced_lease(other_name, crd.DEFAULT_NAMESPACE)) == 403
    assert denied(lambda: coord.list_namespaced_lease("kube-system")) == 403


@pytest.mark.parametrize(
    "patch",
    [
        {"metadata": {"labels": {"app": "changed"}}},
        {"metadata": {"labels": {"added": "x"}}},
        {"metadata": {"annotations": {"note": "x"}}},
        {"spec": {"activeDeadlineSeconds": 5}},
        {"spec": {"containers": [{"name": "app", "image": "evil.example/miner:1"}]}},
        {"metadata": {"finalizers": ["evil.example/never-delete"]}},
        {
            "metadata": {
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "u-1"}
                ]
            }
        },
    ],
)
def test_the_handler_may_patch_only_its_own_pod_label(
    handler_api: client.ApiClient, make_pod: PodFactory, namespace: str, patch: dict[str, Any]
) -> None:
    """RBAC grants `patch pods`; the shipped ValidatingAdmissionPolicy narrows it to labels
    under execwatch.io/ (the label itself is set in every handler test)."""
    name = make_pod(labels={"app": "web"})["metadata"]["name"]
    core = client.CoreV1Api(handler_api)

    def attempt(body: dict[str, Any] = patch) -> int:
        try:
            core.patch_namespaced_pod(
                name, namespace, body, _content_type="application/merge-patch+json"
            )
        except ApiException as exc:
            assert "execwatch-handler-pod-patches" in str(exc.body)
            return int(exc.status)
        return 200

    def attempt_probe() -> int:
        return attempt({"metadata": {"labels": {"probe": uuid.uuid4().hex}}})

    # The policy is enforced once the API server's policy informer has seen it: wait with
    # a patch that changes something new each time, then judge the real one once.
    wait_until(lambda: attempt_probe() == 422, timeout=10)
    assert attempt() == 422
