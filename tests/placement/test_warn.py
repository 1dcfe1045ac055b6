"""Warn mode (`execwatch.io/placement=warn`): the pod is created exactly as submitted,
its creator gets an admission warning, and the Event an enforced pod would get is posted
on the pod. The webhook hands on only the pod's namespace, name and UID: the worker reads
the pod and its namespace again from the API server, so a POST that is not the API
server's reads no secret and writes no Event."""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import ssl
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from execwatch.placement.controller import REPORTING_CONTROLLER, Placer
from execwatch.placement.decision import ContainerVerdict
from execwatch.placement.pullsecrets import PullSecrets
from execwatch.placement.serving import WebhookServer
from execwatch.placement.warnmode import WarnWorker
from execwatch.placement.webhook import GATED_LABEL, http_handler
from execwatch.runnable.verdict import Outcome
from tests.placement.cluster import (
    OWN_NAMESPACE,
    create_pod,
    gates,
    namespace,
    rest_for,
    warn_configuration,
)
from tests.placement.test_controller import F, R, Scripted, Seen, stored
from tests.support.kube.apiserver import KubeCluster, make_pki
from tests.support.wait import wait_until

RS = "web-5d8f"
OWNER = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": RS, "controller": True,
         "uid": "0b9e8f6c-0000-4000-8000-000000000001"}  # fmt: skip
QUICK = (0.05, 0.2, 0.6)  # the worker's reads of a pod not stored yet, shortened


@dataclass
class Warned:
    seen: Seen
    worker: WarnWorker
    server: WebhookServer
    ca: Path


@contextlib.contextmanager
def warn_webhook(
    admin: client.ApiClient, tmp: Path, source: Any, client_ca: Path | None
) -> Iterator[Warned]:
    """The warn webhook served from this process (mutual TLS with `client_ca`) and
    registered as the chart registers it; its worker judges with `source`."""
    make_pki(tmp)
    seen = Seen()
    placer = Placer(rest_for(admin), source, lambda: ("amd64", "arm64"), seen)
    worker = WarnWorker(placer, OWN_NAMESPACE, read_after=QUICK)
    server = WebhookServer(
        ("127.0.0.1", 0),
        http_handler(OWN_NAMESPACE, worker.submit),
        str(tmp / "serving.crt"),
        str(tmp / "serving.key"),
        client_ca=None if client_ca is None else str(client_ca),
    )
    name = f"execwatch-placement-{uuid.uuid4().hex[:6]}"
    admission = client.AdmissionregistrationV1Api(admin)
    worker.start()
    server.start()
    admission.create_validating_webhook_configuration(
        warn_configuration(server.port, tmp / "ca.crt", name)
    )
    try:
        yield Warned(seen, worker, server, tmp / "ca.crt")
    finally:
        admission.delete_validating_webhook_configuration(name)
        server.stop()
        worker.stop()


@pytest.fixture
def warned(kube: KubeCluster, admin: client.ApiClient, tmp_path: Path) -> Iterator[Seen]:
    """Over mutual TLS: only the API server calls it."""
    source = Scripted(by_image={"r.example/app:1": (R, F)})
    with warn_webhook(admin, tmp_path, source, kube.webhook_client_ca) as made:
        yield made.seen


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


def test_a_pod_named_by_the_api_server_gets_its_event_under_that_name(
    warned: Seen, admin: client.ApiClient
) -> None:
    """The warn webhook validates: the API server has named the pod (generateName) and
    given it its UID before it calls it."""
    ns = namespace(admin, "warn")
    meta = {"name": None, "generateName": "web-5d8f-", "ownerReferences": [OWNER]}

    pod = create_pod(admin, ns, metadata=meta)

    name = pod["metadata"]["name"]
    assert gates(pod) == [] and name.startswith("web-5d8f-")
    wait_until(lambda: events_about(admin, ns, "Pod", name) != [], timeout=30)
    [(kind, reason, _)] = events_about(admin, ns, "Pod", name)
    assert (kind, reason) == ("Warning", "Placed")


@dataclass
class SecretReading:
    """A verdict source that reads each pod's pull secrets as the real one does (the real
    PullSecrets, with rights to every secret) and keeps what it read."""

    secrets: PullSecrets
    read: list[dict[str, Any]] = field(default_factory=list)

    def judge(
        self, pod: Mapping[str, Any], container: Mapping[str, Any], deadline: float
    ) -> ContainerVerdict:
        self.read.extend(self.secrets.configs(pod))
        unknown = {"amd64": Outcome.UNKNOWN, "arm64": Outcome.UNKNOWN}
        return ContainerVerdict(container["name"], container["image"], unknown, {})


def victim(admin: client.ApiClient) -> tuple[str, dict[str, Any]]:
    """A namespace that never opted in, with a pull secret `pull` and a pod using it."""
    ns = namespace(admin, None, prefix="victim")
    auth = base64.b64encode(b"victim:secret").decode()
    config = json.dumps({"auths": {"private.example": {"auth": auth}}}).encode()
    client.CoreV1Api(admin).create_namespaced_secret(ns, {
        "metadata": {"name": "pull"}, "type": "kubernetes.io/dockerconfigjson",
        "data": {".dockerconfigjson": base64.b64encode(config).decode()},
    })  # fmt: skip
    pod = create_pod(admin, ns, imagePullSecrets=[{"name": "pull"}],
                     containers=[{"name": "app", "image": "private.example/app:1"}])  # fmt: skip
    return ns, pod


def forged(ns: str, name: str, uid: str) -> bytes:
    """An AdmissionReview as a pod would POST it: any namespace, object and text."""
    pod = {
        "metadata": {"name": name, "uid": uid, "namespace": ns},
        "spec": {
            "imagePullSecrets": [{"name": "pull"}],
            "containers": [{"name": "app", "image": "private.example/app:1"}],
        },
    }
    request = {"uid": str(uuid.uuid4()), "operation": "CREATE", "kind": {"kind": "Pod"},
               "namespace": ns, "name": name, "object": pod}  # fmt: skip
    return json.dumps({"request": request}).encode()


def post(made: Warned, body: bytes) -> tuple[int, dict[str, Any]]:
    ctx = ssl.create_default_context(cafile=str(made.ca))
    conn = http.client.HTTPSConnection("127.0.0.1", made.server.port, context=ctx, timeout=10)
    with contextlib.closing(conn):
        conn.request("POST", "/warn", body, {"Content-Type": "application/json"})
        answer = conn.getresponse()
        return answer.status, json.loads(answer.read())


def test_a_forged_review_reads_no_secret_and_writes_no_event(
    admin: client.ApiClient, tmp_path: Path
) -> None:
    """Without mutual TLS any pod can reach the port: a POST naming a victim namespace's
    pod (its real name and UID) or a pod that does not exist, with the victim's pull
    secret and the attacker's image, is answered, and nothing else happens."""
    ns, pod = victim(admin)
    opted_in = namespace(admin, "warn")
    reviews = [
        forged(ns, pod["metadata"]["name"], pod["metadata"]["uid"]),  # real, not opted in
        forged(ns, "forged", str(uuid.uuid4())),  # no such pod
        forged(opted_in, "ghost", str(uuid.uuid4())),  # opted in, no such pod
        forged("default", "kubernetes", str(uuid.uuid4())),  # an Event about anything
    ]
    source = SecretReading(PullSecrets(rest_for(admin)))
    with warn_webhook(admin, tmp_path, source, client_ca=None) as made:
        for body in reviews:
            status, answer = post(made, body)
            assert (status, answer["response"]["allowed"]) == (200, True)
        wait_until(made.worker.idle, timeout=30)

    assert source.read == [], "the victim's pull secret was read"
    assert made.seen.decisions == []
    for where in (ns, opted_in, "default"):
        listed = client.EventsV1Api(admin).list_namespaced_event(where).items
        assert [e for e in listed if e.reporting_controller == REPORTING_CONTROLLER] == []
