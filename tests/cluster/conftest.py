"""Fixtures for the cluster pipeline tests: a real API server (tests/kube), pods without a
kubelet, and handlers/publishers running with their own ServiceAccounts' tokens."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from execwatch import crd
from execwatch.handler.controller import LABEL, Handler, HandlerConfig
from execwatch.handler.metrics import HandlerMetrics
from execwatch.placement.observed import feedback_hook
from execwatch.record import ExecFailure
from tests.support.kube.apiserver import KubeCluster
from tests.support.kube.apiserver_fixtures import (
    AGENT_NODE,
    admin,
    agent_api,
    agent_rest,
    handler_api,
    handler_kube,
    kube,
)
from tests.support.runtime.runc import Runc
from tests.support.wait import wait_until

__all__ = [
    "admin",
    "agent_api",
    "agent_rest",
    "handler_api",
    "handler_kube",
    "kube",
    "wait_until",
]

NODE = AGENT_NODE


def label_of(admin: client.ApiClient, pod: dict[str, Any]) -> str | None:
    """The handler's label on the pod as the API server has it now (None: not set)."""
    meta = pod["metadata"]
    current = client.CoreV1Api(admin).read_namespaced_pod(meta["name"], meta["namespace"])
    labels: dict[str, str] = current.metadata.labels or {}
    return labels.get(LABEL)


def list_records(api: client.ApiClient) -> list[dict[str, Any]]:
    result = client.CustomObjectsApi(api).list_namespaced_custom_object(
        crd.GROUP, crd.VERSION, crd.DEFAULT_NAMESPACE, crd.PLURAL
    )
    items: list[dict[str, Any]] = result["items"]
    return items


def publish(
    api: client.ApiClient,
    failure: ExecFailure,
    *,
    node: str = NODE,
    count: int | None = None,
    name: str | None = None,
) -> str:
    """Create one record as the agent would (agent credentials)."""
    name = name or f"{node}-{uuid.uuid4().hex[:16]}"
    t = failure.event.time
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        crd.GROUP,
        crd.VERSION,
        crd.DEFAULT_NAMESPACE,
        crd.PLURAL,
        crd.to_body(
            failure,
            name=name,
            namespace=crd.DEFAULT_NAMESPACE,
            node=node,
            first_seen=t,
            last_seen=t,
            count=count or failure.count,
        ),
    )
    return name


def drained(admin: client.ApiClient, *handlers: Handler) -> Callable[[], bool]:
    """No record left and the handlers done with the last one (it is deleted before it is
    counted, so an empty queue alone does not mean the metric is final)."""
    return lambda: not list_records(admin) and all(h.idle() for h in handlers)


@pytest.fixture(autouse=True)
def clean_queue(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each API test starts with no records and no handler Lease."""
    if "kube" not in request.fixturenames:
        yield
        return
    cluster: KubeCluster = request.getfixturevalue("kube")

    def wipe() -> None:
        with cluster.client() as api:
            with contextlib.suppress(ApiException):
                client.CustomObjectsApi(api).delete_collection_namespaced_custom_object(
                    crd.GROUP, crd.VERSION, crd.DEFAULT_NAMESPACE, crd.PLURAL
                )
            with contextlib.suppress(ApiException):
                client.CoordinationV1Api(api).delete_namespaced_lease(
                    "execwatch-handler", crd.DEFAULT_NAMESPACE
                )

    wipe()
    yield
    wipe()


@pytest.fixture
def namespace(admin: client.ApiClient) -> str:
    """A fresh namespace for the test's pods."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    client.CoreV1Api(admin).create_namespace(client.V1Namespace(metadata={"name": name}))
    return name


PodFactory = Callable[..., dict[str, Any]]


@pytest.fixture
def make_pod(admin: client.ApiClient, namespace: str) -> PodFactory:
    """Create a Pod bound to a node and mark it Running through the status subresource,
    as a kubelet would (there is no kubelet here)."""

    def make(
        name: str = "app-7d9f8b6c5d-x2x4k",
        node: str = NODE,
        containers: tuple[str, ...] = ("app",),
        deployment: str | None = "app",
        labels: dict[str, str] | None = None,
        container_ids: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        core = client.CoreV1Api(admin)
        meta: dict[str, Any] = {"name": name, "labels": dict(labels or {})}
        if deployment:
            meta["labels"]["pod-template-hash"] = "7d9f8b6c5d"
            meta["ownerReferences"] = [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "controller": True,
                    "name": f"{deployment}-7d9f8b6c5d",
                    "uid": str(uuid.uuid4()),
                }
            ]
        pod = core.create_namespaced_pod(
            namespace,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": meta,
                "spec": {
                    "nodeName": node,
                    "containers": [
                        {"name": c, "image": "registry.example/app:1"} for c in containers
                    ],
                },
            },
        )
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        core.patch_namespaced_pod_status(
            name,
            namespace,
            {
                "status": {
                    "phase": "Running",
                    "containerStatuses": [
                        {
                            "name": c,
                            "ready": False,
                            "restartCount": 3,
                            "image": "registry.example/app:1",
                            "imageID": "",
                            "containerID": "containerd://"
                            + (container_ids or {}).get(c, uuid.uuid4().hex),
                            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                            "lastState": {
                                "terminated": {
                                    "exitCode": 1,
                                    "reason": "Error",
                                    "startedAt": now,
                                    "finishedAt": now,
                                }
                            },
                        }
                        for c in containers
                    ],
                }
            },
        )
        data: dict[str, Any] = admin.sanitize_for_serialization(pod)
        return data

    return make


@pytest.fixture
def start_handler(handler_kube: Any) -> Iterator[Callable[..., Handler]]:
    """Start in-process handler replicas as the handler ServiceAccount; stop them after."""
    started: list[Handler] = []

    def start(identity: str = "replica-1", feedback: bool = False, **overrides: Any) -> Handler:
        settings: dict[str, Any] = {
            "lease_duration": 4.0,
            "renew_deadline": 3.0,
            "retry_period": 0.5,
            "retry_initial": 0.2,
            "retry_max": 2.0,
        }
        settings.update(overrides)
        metrics = HandlerMetrics(max_series=settings.pop("max_series", 5000))
        config = HandlerConfig(identity=identity, **settings)
        hook = feedback_hook(config.namespace) if feedback else None
        h = Handler(config, handler_kube, metrics, hook=hook)
        h.start()
        started.append(h)
        return h

    yield start
    for h in started:
        h.stop()


@pytest.fixture
def pod(make_pod: PodFactory) -> dict[str, Any]:
    """One running pod of a Deployment, `app`, on the agent's node (make_pod's defaults).
    Named before `handler` among a test's arguments, it exists before the handler starts."""
    return make_pod()


@pytest.fixture
def handler(start_handler: Callable[..., Handler]) -> Handler:
    """One handler replica with start_handler's defaults, running."""
    return start_handler()


Deliver = Callable[..., str]


@pytest.fixture
def deliver(admin: client.ApiClient, agent_api: client.ApiClient) -> Deliver:
    """Publish one record as the agent would (publish's keywords), then wait until the
    handler has handled every record: deliver(handler, failure, count=...) -> its name."""

    def send(handler: Handler, failure: ExecFailure, **record: Any) -> str:
        name = publish(agent_api, failure, **record)
        wait_until(drained(admin, handler))
        return name

    return send


@pytest.fixture
def runc(tmp_path: Path) -> Iterator[Runc]:
    runtime = Runc(tmp_path / "runc")  # fails loudly if runc or the arm64 busybox is missing
    yield runtime
    runtime.cleanup()
