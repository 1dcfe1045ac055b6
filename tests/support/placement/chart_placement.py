"""The chart's placement objects as the placement tests and benchmark install them: its
names, its rights (ServiceAccounts, roles, admission policies), its webhooks pointed at
loopback, the kubelet's copy of the TLS Secret, and a Lease held by another replica."""

from __future__ import annotations

import base64
import os
import threading
from datetime import UTC, datetime
from pathlib import Path

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.support.deploy.chart import Doc

NAME = "execwatch-placement"
NS = "execwatch"
# The chart's placement rights: its ServiceAccounts and roles, and the admission policies
# that narrow them.
CHART_KINDS = ("ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding",
               "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")  # fmt: skip
CLUSTER_KINDS = CHART_KINDS[3:]
WEBHOOKS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
VERDICTS = "imageverdicts.execwatch.io"
NODES = {"placement-amd64": "amd64", "placement-arm64": "arm64"}


def loopback(config: Doc, port: int) -> Doc:
    """The chart's configuration with each webhook's Service replaced by loopback."""
    for hook in config["webhooks"]:
        service = hook["clientConfig"].pop("service")
        hook["clientConfig"]["url"] = f"https://localhost:{port}{service['path']}"
    return config


def placement_rights(docs: list[Doc]) -> list[Doc]:
    return [d for d in docs if d["kind"] in CHART_KINDS and d["metadata"]["name"].startswith(NAME)]


class Kubelet:
    """Copies the Secret's tls.crt and tls.key into `directory` whenever they change,
    each file replaced whole (the kubelet swaps the whole directory)."""

    def __init__(self, api: client.ApiClient, directory: Path) -> None:
        self.api, self.directory = api, directory
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        seen: dict[str, str] = {}
        while not self.stop.wait(0.2):
            data = client.CoreV1Api(self.api).read_namespaced_secret(f"{NAME}-tls", NS).data or {}
            for key in ("tls.crt", "tls.key"):
                if data.get(key) and data[key] != seen.get(key):
                    tmp = self.directory / f".{key}"
                    tmp.write_bytes(base64.b64decode(data[key]))
                    os.replace(tmp, self.directory / key)
                    seen[key] = data[key]


def own_env(tmp: Path) -> dict[str, str]:
    """No registry credentials of the process's own: it pulls with the pods' only."""
    drop = {"REGISTRY_AUTH_FILE", "XDG_RUNTIME_DIR", "DOCKER_CONFIG"}
    return {**{k: v for k, v in os.environ.items() if k not in drop}, "HOME": str(tmp)}


def ca_bundle_set(admin: client.ApiClient) -> bool:
    config = client.AdmissionregistrationV1Api(admin).read_mutating_webhook_configuration(NAME)
    return all(hook.client_config.ca_bundle for hook in config.webhooks)


def hold_lease(admin: client.ApiClient) -> None:
    """Another replica holds the Lease: the process under test stays a standby."""
    now = datetime.now(tz=UTC)
    body = {
        "metadata": {"name": NAME},
        "spec": {"holderIdentity": "someone-else", "leaseDurationSeconds": 3600,
                 "acquireTime": now, "renewTime": now},
    }  # fmt: skip
    leases = client.CoordinationV1Api(admin)
    try:
        leases.create_namespaced_lease(NS, body)
    except ApiException as exc:
        if exc.status != 409:
            raise
        leases.patch_namespaced_lease(NAME, NS, body)
