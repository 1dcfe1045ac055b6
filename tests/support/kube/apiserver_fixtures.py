"""pytest fixtures over tests/support/kube/apiserver.py; conftest files import them by name.

One control plane per test session (starting it costs seconds), with deploy/base applied.
Tests that need a clean queue use `clean_records`; tests share nothing else.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from tests.support.kube.apiserver import (
    KubeCluster,
    MissingBinaries,
    find_binaries,
    load_manifests,
    running_cluster,
)

AGENT_SA = ("execwatch", "execwatch-agent")
AGENT_NODE = "node-a"  # the node of the agent pod whose token `agent_api` uses
HANDLER_SA = ("execwatch", "execwatch-handler")


@pytest.fixture(scope="session")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeCluster]:
    """etcd + kube-apiserver with the shipped CRD, RBAC and quota applied."""
    try:
        find_binaries()
    except MissingBinaries as exc:
        pytest.fail(str(exc), pytrace=False)
    with running_cluster(tmp_path_factory.mktemp("kube")) as cluster:
        cluster.apply(load_manifests())
        yield cluster


@pytest.fixture
def admin(kube: KubeCluster) -> Iterator[client.ApiClient]:
    with kube.client() as api:
        yield api


@pytest.fixture
def agent_api(kube: KubeCluster) -> Iterator[client.ApiClient]:
    """An ApiClient authenticated as the agent's ServiceAccount, with the token of an
    agent pod on AGENT_NODE (records it creates must name that node)."""
    with kube.client(kube.node_token(*AGENT_SA, AGENT_NODE)) as api:
        yield api


@pytest.fixture
def handler_api(kube: KubeCluster) -> Iterator[client.ApiClient]:
    """An ApiClient authenticated as the handler's ServiceAccount."""
    with kube.client(kube.service_account_token(*HANDLER_SA)) as api:
        yield api


@pytest.fixture
def handler_kube(kube: KubeCluster) -> Any:
    """The handler's own configuration (`kube.client.config_for`) for the
    handler's ServiceAccount, as `handler_api`."""
    return kube.client_config(kube.service_account_token(*HANDLER_SA))


@pytest.fixture
def agent_rest(kube: KubeCluster) -> Iterator[Any]:
    """The agent's own client (`kube.client.Rest`) with the token of an agent pod
    on AGENT_NODE, as `agent_api`."""
    with kube.rest(kube.node_token(*AGENT_SA, AGENT_NODE)) as api:
        yield api
