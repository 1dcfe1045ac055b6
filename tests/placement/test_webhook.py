"""The real API server calls the gate webhook on pod creates in opted-in namespaces.

What the API server stores is what the scheduler will see."""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from execwatch.placement.serving import WebhookServer
from execwatch.placement.webhook import GATE, GATED_LABEL, MODE_LABEL, BadReview, review
from tests.placement.cluster import OWN_NAMESPACE, configuration, create_pod, gates, namespace
from tests.support.kube.apiserver import KubeCluster, client_cert


@pytest.mark.parametrize("mode", ["enforce", "mitigate"])
def test_a_new_pod_of_an_opted_in_namespace_is_gated_and_labelled(
    registered: WebhookServer, admin: client.ApiClient, mode: str
) -> None:
    pod = create_pod(admin, namespace(admin, mode), metadata={"labels": {"app": "web"}})

    assert gates(pod) == [GATE]
    assert pod["metadata"]["labels"] == {"app": "web", GATED_LABEL: "pending"}


def test_a_pod_with_gates_of_its_own_keeps_them_and_gets_ours(
    registered: WebhookServer, admin: client.ApiClient
) -> None:
    pod = create_pod(admin, namespace(admin, "enforce"), schedulingGates=[{"name": "x.io/mine"}])
    assert gates(pod) == ["x.io/mine", GATE]
    assert pod["metadata"]["labels"] == {GATED_LABEL: "pending"}


@pytest.mark.parametrize(
    ("mode", "prefix", "spec"),
    [
        (None, "team", {}),  # not opted in: the API server does not even call the webhook
        ("warn", "team", {}),  # warn mode never changes pods
        ("enforce", "kube", {}),  # kube-* namespaces
        ("enforce", "team", {"nodeName": "node-a"}),  # the scheduler is not involved
        ("enforce", "team", {"metadata": {"ownerReferences": [{
            "apiVersion": "apps/v1", "kind": "DaemonSet", "name": "ds",
            "uid": "9d6c8d1e-0000-4000-8000-000000000000"}]}}),
    ],
)  # fmt: skip
def test_pods_that_are_never_gated(
    registered: WebhookServer,
    admin: client.ApiClient,
    mode: str | None,
    prefix: str,
    spec: dict[str, Any],
) -> None:
    pod = create_pod(admin, namespace(admin, mode, prefix), **spec)
    assert gates(pod) == []
    assert GATED_LABEL not in (pod["metadata"].get("labels") or {})


def test_execwatchs_own_namespace_is_never_gated(
    registered: WebhookServer, admin: client.ApiClient
) -> None:
    ns = OWN_NAMESPACE
    core = client.CoreV1Api(admin)
    core.patch_namespace(ns, {"metadata": {"labels": {MODE_LABEL: "enforce"}}})
    try:
        pod = create_pod(admin, ns, metadata={"name": f"own-{uuid.uuid4().hex[:6]}"})
        assert gates(pod) == []
    finally:
        core.patch_namespace(ns, {"metadata": {"labels": {MODE_LABEL: None}}})


def test_a_webhook_that_is_down_never_blocks_a_pod(
    kube: KubeCluster, admin: client.ApiClient, webhook: tuple[WebhookServer, Path]
) -> None:
    _, ca = webhook
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]
    name = f"execwatch-placement-dead-{uuid.uuid4().hex[:6]}"
    admission = client.AdmissionregistrationV1Api(admin)
    admission.create_mutating_webhook_configuration(configuration(dead_port, ca, name))
    try:
        pod = create_pod(admin, namespace(admin, "enforce"))
        assert gates(pod) == []
    finally:
        admission.delete_mutating_webhook_configuration(name)


def test_idle_connections_never_stop_the_webhook(
    registered: WebhookServer, admin: client.ApiClient
) -> None:
    idle = [socket.create_connection(("127.0.0.1", registered.port)) for _ in range(200)]
    try:
        pod = create_pod(admin, namespace(admin, "enforce"))
    finally:
        for s in idle:
            s.close()
    assert gates(pod) == [GATE]


@pytest.mark.parametrize("body", [b"", b"{", b'{"request": {}}', b"[]", b"x" * ((3 << 20) + 1)])
def test_a_body_that_is_no_admission_review_is_refused(body: bytes) -> None:
    with pytest.raises(BadReview):
        review(body, OWN_NAMESPACE)


def post_review(port: int, server_ca: Path, cert: tuple[Path, Path] | None) -> int:
    """POST a gate review as any pod could, presenting `cert` (None: no certificate);
    the HTTP status, or 0 when the connection is refused before an answer."""
    ctx = ssl.create_default_context(cafile=str(server_ca))
    if cert is not None:
        ctx.load_cert_chain(str(cert[0]), str(cert[1]))
    request = {"uid": "u", "operation": "CREATE", "kind": {"kind": "Pod"}, "namespace": "team",
               "object": {"metadata": {"name": "p"}, "spec": {"containers": []}}}  # fmt: skip
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=10)
    try:
        conn.request("POST", "/gate", json.dumps({"request": request}).encode())
        return conn.getresponse().status
    except (ssl.SSLError, ConnectionError, http.client.HTTPException):
        return 0
    finally:
        conn.close()


def test_only_the_api_servers_client_certificate_is_let_in(
    kube: KubeCluster, registered: WebhookServer, webhook: tuple[WebhookServer, Path]
) -> None:
    """With `--webhook-client-ca` the handshake requires a certificate of the CA the API
    server's AdmissionConfiguration takes its client certificate from: a pod's plain POST,
    or one with a certificate of another CA (here the API server's own client CA), is
    refused before any HTTP; the API server's calls go on (the other tests here)."""
    _, server_ca = webhook
    other = client_cert(kube.workdir / "pki", "stranger", "/CN=system:admin")
    apiservers = kube.webhook_client_ca.parent
    theirs = (apiservers / "apiserver.crt", apiservers / "apiserver.key")

    assert post_review(registered.port, server_ca, None) == 0
    assert post_review(registered.port, server_ca, other) == 0
    assert post_review(registered.port, server_ca, theirs) == 200
