"""Pods, namespaces and the gate webhook's registration on the tests' API server."""

from __future__ import annotations

import base64
import uuid
from pathlib import Path
from typing import Any

from kubernetes import client

from execwatch.kube.client import Rest, config_for
from execwatch.placement.webhook import MODE_LABEL

OWN_NAMESPACE = "execwatch"


def configuration(port: int, ca: Path | None, name: str, host: str = "127.0.0.1") -> dict[str, Any]:
    """The chart's MutatingWebhookConfiguration (gate), pointed at a webhook on loopback
    (no caBundle with `ca` None: the controller sets it)."""
    bundle = {} if ca is None else {"caBundle": base64.b64encode(ca.read_bytes()).decode()}
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            _webhook("gate", f"https://{host}:{port}/gate", bundle, ["enforce", "mitigate"]),
        ],
    }


def warn_configuration(
    port: int, ca: Path | None, name: str, host: str = "127.0.0.1"
) -> dict[str, Any]:
    """The chart's ValidatingWebhookConfiguration (warn), as `configuration`."""
    bundle = {} if ca is None else {"caBundle": base64.b64encode(ca.read_bytes()).decode()}
    warn = _webhook("warn", f"https://{host}:{port}/warn", bundle, ["warn"])
    warn["sideEffects"] = "NoneOnDryRun"
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [warn],
    }


def _webhook(kind: str, url: str, bundle: dict[str, str], modes: list[str]) -> dict[str, Any]:
    return {
        "name": f"{kind}.placement.execwatch.io",
        "clientConfig": {"url": url, **bundle},
        "rules": [
            {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
             "resources": ["pods"], "scope": "Namespaced"}
        ],
        "namespaceSelector": {
            "matchExpressions": [{"key": MODE_LABEL, "operator": "In", "values": modes}]
        },
        "failurePolicy": "Ignore",
        "sideEffects": "None",
        "timeoutSeconds": 5,
        "admissionReviewVersions": ["v1"],
    }  # fmt: skip


def rest_for(api: client.ApiClient) -> Rest:
    """Placement's own client (`kube.client.Rest`) with the same
    server, CA and bearer token as the tests' official client `api`."""
    cfg = api.configuration
    token = str(cfg.api_key["authorization"]).removeprefix("Bearer ")
    return Rest(config_for(str(cfg.host), str(cfg.ssl_ca_cert), token))


def namespace(api: client.ApiClient, mode: str | None, prefix: str = "team") -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    labels = {MODE_LABEL: mode} if mode else {}
    client.CoreV1Api(api).create_namespace({"metadata": {"name": name, "labels": labels}})
    return name


def create_pod(api: client.ApiClient, ns: str, **spec: Any) -> dict[str, Any]:
    meta = spec.pop("metadata", {})
    body = {
        "metadata": {"name": "p", **meta},
        "spec": {"containers": [{"name": "app", "image": "r.example/app:1"}], **spec},
    }
    created = client.CoreV1Api(api).create_namespaced_pod(ns, body)
    result: dict[str, Any] = api.sanitize_for_serialization(created)
    return result


def gates(pod: dict[str, Any]) -> list[str]:
    return [g["name"] for g in pod["spec"].get("schedulingGates") or []]
