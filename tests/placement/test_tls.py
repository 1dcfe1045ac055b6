"""The controller's own certificate, end to end: the Secret it writes, the caBundle it
sets, and the real API server calling the webhook with them."""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from execwatch.placement.serving import WebhookServer
from execwatch.placement.webhook import GATE, http_handler
from execwatch.serving.certs import SERVING_LIFETIME
from execwatch.serving.tls import CertFiles, CertRotator
from tests.placement.cluster import (
    OWN_NAMESPACE,
    configuration,
    create_pod,
    gates,
    namespace,
    rest_for,
    warn_configuration,
)
from tests.support.kube.apiserver import free_port

NAMES = ["localhost"]


@dataclass
class Env:
    """A webhook configuration on a chosen port; the server starts on the Secret's files."""

    admin: client.ApiClient
    rotator: CertRotator
    files: CertFiles
    port: int
    server: WebhookServer | None = None

    @property
    def name(self) -> str:
        return self.rotator.secret

    def secret(self) -> client.V1Secret:
        return client.CoreV1Api(self.admin).read_namespaced_secret(self.name, "execwatch")

    def write_files(self) -> None:
        data = self.secret().data
        Path(self.files.cert).write_bytes(base64.b64decode(data["tls.crt"]))
        Path(self.files.key).write_bytes(base64.b64decode(data["tls.key"]))

    def serve(self) -> None:
        self.write_files()
        handler = http_handler(OWN_NAMESPACE)
        self.server = WebhookServer(
            ("127.0.0.1", self.port), handler, self.files.cert, self.files.key
        )
        self.server.start()


@pytest.fixture
def env(admin: client.ApiClient, tmp_path: Path) -> Iterator[Env]:
    name = f"execwatch-placement-{uuid.uuid4().hex[:6]}"
    files = CertFiles(str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"))
    port = free_port()
    config = configuration(port, None, name, host="localhost")
    admission = client.AdmissionregistrationV1Api(admin)
    admission.create_mutating_webhook_configuration(config)
    admission.create_validating_webhook_configuration(
        warn_configuration(port, None, name, host="localhost")
    )
    made = Env(admin, CertRotator(rest_for(admin), "execwatch", name, name, NAMES), files, port)
    try:
        yield made
    finally:
        if made.server is not None:
            made.server.stop()
        admission.delete_mutating_webhook_configuration(name)
        admission.delete_validating_webhook_configuration(name)
        with contextlib.suppress(ApiException):
            client.CoreV1Api(admin).delete_namespaced_secret(name, "execwatch")


def ca_bundle(admin: client.ApiClient, name: str) -> bytes:
    """The caBundle of the gate and the warn webhook, when they are the same."""
    admission = client.AdmissionregistrationV1Api(admin)
    configs = (admission.read_mutating_webhook_configuration(name),
               admission.read_validating_webhook_configuration(name))  # fmt: skip
    [bundle] = {c.webhooks[0].client_config.ca_bundle or "" for c in configs}
    return base64.b64decode(bundle)


def test_the_api_server_trusts_the_webhook_once_the_ca_bundle_is_set(
    env: Env, admin: client.ApiClient
) -> None:
    assert ca_bundle(admin, env.name) == b""

    assert env.rotator.sync() is True
    assert env.rotator.sync() is False, "nothing to write once in step"
    env.serve()

    secret = env.secret()
    assert secret.type == "kubernetes.io/tls"
    assert ca_bundle(admin, env.name) == base64.b64decode(secret.data["ca.crt"])
    assert gates(create_pod(admin, namespace(admin, "enforce"))) == [GATE]


def test_a_ca_bundle_changed_by_hand_is_put_back(env: Env, admin: client.ApiClient) -> None:
    env.rotator.sync()
    env.serve()
    admission = client.AdmissionregistrationV1Api(admin)
    patch = [{"op": "replace", "path": "/webhooks/0/clientConfig/caBundle", "value": "eA=="}]
    admission.patch_mutating_webhook_configuration(env.name, patch)
    assert gates(create_pod(admin, namespace(admin, "enforce"))) == [], "untrusted: ignored"

    assert env.rotator.sync() is True
    assert gates(create_pod(admin, namespace(admin, "enforce"))) == [GATE]


def test_a_broken_secret_is_replaced_and_served_after_a_reload(
    env: Env, admin: client.ApiClient
) -> None:
    env.rotator.sync()
    env.serve()
    assert env.files.changed()
    core = client.CoreV1Api(admin)
    core.patch_namespaced_secret(env.name, "execwatch", {"data": {"tls.crt": "bm90IGEgY2VydA=="}})

    assert env.rotator.sync() is True
    env.write_files()
    assert env.files.changed() and not env.files.changed()
    assert env.server is not None
    env.server.reload()
    assert gates(create_pod(admin, namespace(admin, "enforce"))) == [GATE]


def test_the_serving_certificate_is_renewed_under_the_same_ca(env: Env) -> None:
    env.rotator.sync()
    before = env.secret().data
    env.rotator.now = lambda: dt.datetime.now(dt.UTC) + SERVING_LIFETIME * 0.7

    assert env.rotator.sync() is True

    after = env.secret().data
    assert after["ca.crt"] == before["ca.crt"] and after["tls.crt"] != before["tls.crt"]
