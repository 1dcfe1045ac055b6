"""The placement tests run against the real API server of tests/kube, with the gate
webhook served from this process on loopback behind TLS and registered with a
MutatingWebhookConfiguration as the chart registers it. The code under test talks to the
API server with its own client (`kube.client.Rest`: `rest`);
the tests read and write with the official client (`admin`), their independent oracle."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from execwatch.kube.client import Rest
from execwatch.placement.serving import WebhookServer
from execwatch.placement.webhook import http_handler
from tests.placement.cluster import OWN_NAMESPACE, configuration
from tests.scan.conftest import built, host_glibc, host_musl
from tests.support.kube.apiserver import ADMIN_TOKEN, KubeCluster, make_pki
from tests.support.kube.apiserver_fixtures import admin, kube
from tests.support.registry.registry_fixtures import pushed, registry

__all__ = ["admin", "built", "host_glibc", "host_musl", "kube", "pushed", "registry"]


@pytest.fixture
def rest(kube: KubeCluster) -> Iterator[Rest]:
    """Placement's own client, with the tests' admin credentials."""
    with Rest(kube.client_config(ADMIN_TOKEN)) as made:
        yield made


@pytest.fixture(scope="module")
def webhook(
    kube: KubeCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[WebhookServer, Path]]:
    """The gate webhook over mutual TLS: it accepts only the API server's client
    certificate (the API server's AdmissionConfiguration gives it one)."""
    pki = tmp_path_factory.mktemp("webhook-pki")
    make_pki(pki)
    server = WebhookServer(
        ("127.0.0.1", 0),
        http_handler(OWN_NAMESPACE),
        str(pki / "serving.crt"),
        str(pki / "serving.key"),
        client_ca=str(kube.webhook_client_ca),
    )
    server.start()
    try:
        yield server, pki / "ca.crt"
    finally:
        server.stop()


@pytest.fixture
def registered(kube: KubeCluster, webhook: tuple[WebhookServer, Path]) -> Iterator[WebhookServer]:
    server, ca = webhook
    name = f"execwatch-placement-{uuid.uuid4().hex[:6]}"
    with kube.client() as api:
        admission = client.AdmissionregistrationV1Api(api)
        admission.create_mutating_webhook_configuration(configuration(server.port, ca, name))
        try:
            yield server
        finally:
            admission.delete_mutating_webhook_configuration(name)
