"""Warn mode (`execwatch.io/placement=warn`): the pod is created exactly as submitted,
its creator gets an admission warning, and the Event an enforced pod would get is posted
on the pod, or on its controller when the pod has no name yet (generateName)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from execwatch.placement.controller import Placer
from execwatch.placement.serving import WebhookServer
from execwatch.placement.warnmode import WarnWorker
from execwatch.placement.webhook import GATED_LABEL, http_handler
from tests.kube.cluster import make_pki
from tests.placement.cluster import (
    OWN_NAMESPACE,
    configuration,
    create_pod,
    gates,
    namespace,
    rest_for,
)
from tests.placement.test_controller import F, R, Scripted, Seen, stored
from tests.support.wait import wait_until

RS = "web-5d8f"
OWNER = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": RS, "controller": True,
         "uid": "0b9e8f6c-0000-4000-8000-000000000001"}  # fmt: skip


@pytest.fixture
def warned(admin: client.ApiClient, tmp_path: Path) -> Iterator[Seen]:
    make_pki(tmp_path)
    seen = Seen()
    source = Scripted(by_image={"r.example/app:1": (R, F)})
    worker = WarnWorker(Placer(rest_for(admin), source, lambda: ("amd64", "arm64"), seen))
    server = WebhookServer(
        ("127.0.0.1", 0),
        http_handler(OWN_NAMESPACE, worker.submit),
        str(tmp_path / "serving.crt"),
        str(tmp_path / "serving.key"),
    )
    name = f"execwatch-placement-{uuid.uuid4().hex[:6]}"
    admission = client.AdmissionregistrationV1Api(admin)
    worker.start()
    server.start()
    admission.create_mutating_webhook_configuration(
        configuration(server.port, tmp_path / "ca.crt", name)
    )
    try:
        yield seen
    finally:
        admission.delete_mutating_webhook_configuration(name)
        server.stop()
        worker.stop()


def events_about(
    api: client.ApiClient, ns: str, kind: str, name: str
) -> list[tuple[str, str, str]]:
    listed = client.EventsV1Api(api).list_namespaced_event(
        ns, field_selector=f"regarding.kind={kind},regarding.name={name}"
    )
    return [(e.type, e.reason, e.note) for e in listed.items]


def test_the_pod_is_unchanged_and_gets_the_event_it_would_get_when_enforced(
    warned: Seen, admin: client.ApiClient
) -> None:
    ns = namespace(admin, "warn")
    body = {
        "metadata": {"name": "p", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "app", "image": "r.example/app:1"}]},
    }

    created, _, headers = client.CoreV1Api(admin).create_namespaced_pod_with_http_info(ns, body)

    pod: dict[str, Any] = admin.sanitize_for_serialization(created)
    assert "execwatch.io/placement=warn: this pod is not gated" in headers["Warning"]
    wait_until(lambda: events_about(admin, ns, "Pod", "p") != [], timeout=30)
    [(kind, reason, note)] = events_about(admin, ns, "Pod", "p")
    assert (kind, reason) == ("Warning", "Placed")
    assert note.startswith("warn mode, pod unchanged: placed on amd64 only: arm64: container")
    now = stored(admin, pod)
    assert now["metadata"]["labels"] == {"app": "web"}
    assert GATED_LABEL not in now["metadata"]["labels"]
    assert (gates(now), now["spec"].get("affinity")) == ([], None)
    assert warned.decisions == ["warn"]


def test_a_pod_without_a_name_yet_gets_its_event_on_its_controller(
    warned: Seen, admin: client.ApiClient
) -> None:
    ns = namespace(admin, "warn")
    meta = {"name": None, "generateName": "web-5d8f-", "ownerReferences": [OWNER]}

    pod = create_pod(admin, ns, metadata=meta)

    assert gates(pod) == []
    wait_until(lambda: events_about(admin, ns, "ReplicaSet", RS) != [], timeout=30)
    [(kind, reason, _)] = events_about(admin, ns, "ReplicaSet", RS)
    assert (kind, reason) == ("Warning", "Placed")
