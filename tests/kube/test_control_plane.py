"""The test control plane itself: real authentication, real RBAC, manifests applied."""

from __future__ import annotations

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.support.kube.apiserver import KubeCluster


def test_api_server_serves_the_shipped_crd(admin: client.ApiClient) -> None:
    crd = client.ApiextensionsV1Api(admin).read_custom_resource_definition(
        "execfailures.execwatch.io"
    )
    assert crd.spec.group == "execwatch.io"
    assert [v.name for v in crd.spec.versions] == ["v1alpha1"]


def test_service_account_tokens_authenticate_as_the_service_account(
    kube: KubeCluster, agent_api: client.ApiClient
) -> None:
    review = client.AuthenticationV1Api(agent_api).create_self_subject_review(
        client.V1SelfSubjectReview()
    )
    assert review.status.user_info.username == "system:serviceaccount:execwatch:execwatch-agent"


def test_an_unknown_token_is_rejected(kube: KubeCluster) -> None:
    with kube.client("not-a-token") as api, pytest.raises(ApiException) as err:
        client.CoreV1Api(api).list_namespace()
    assert err.value.status == 401
