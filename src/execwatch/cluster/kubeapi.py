"""The agent's Kubernetes API client: one create, and the optional node-scoped pod watch.

The agent uses lightkube, not the official `kubernetes` client the handler uses: release
36 of the official client imports its ~1000 generated models at once (58 MB of a 101 MB
agent), while lightkube's client, TLS and config cost ~15 MB and it covers what the
agent needs: in-cluster config with a rotated token file, kubeconfig, a create of a
custom resource, and a pod list + watch with a field selector. Its exceptions are
translated here into `cluster.errors`, which alone decides what they mean.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

from execwatch.cluster import crd, errors


def client(kubeconfig: str | None = None, timeout: float = 10.0) -> Any:
    """A lightkube Client: the given kubeconfig, else in-cluster, else $KUBECONFIG or
    ~/.kube/config. In-cluster, the ServiceAccount token file is re-read as the kubelet
    rotates it."""
    import httpx2
    from lightkube import Client, KubeConfig

    config = KubeConfig.from_file(kubeconfig) if kubeconfig else KubeConfig.from_env()
    logging.getLogger("httpx2").setLevel(logging.WARNING)  # not a line per request
    return Client(config, timeout=httpx2.Timeout(timeout), field_manager="execwatch-agent")


def client_for(server: str, ca_file: str, token: str, timeout: float = 10.0) -> Any:
    """A lightkube Client for one server and bearer token (tests, benchmarks)."""
    from lightkube import KubeConfig

    doc = {
        "clusters": [
            {"name": "c", "cluster": {"server": server, "certificate-authority": ca_file}}
        ],
        "users": [{"name": "u", "user": {"token": token}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    import httpx2
    from lightkube import Client

    return Client(KubeConfig.from_dict(doc), timeout=httpx2.Timeout(timeout))


@functools.cache
def _record_resource() -> Any:
    from lightkube.generic_resource import create_namespaced_resource

    return create_namespaced_resource(crd.GROUP, crd.VERSION, crd.KIND, crd.PLURAL)


@contextlib.contextmanager
def translate() -> Iterator[None]:
    """lightkube's and httpx2's exceptions as `errors.ApiError` kinds."""
    import httpx2
    from lightkube import ApiError as LightkubeError

    try:
        yield
    except LightkubeError as exc:
        status = exc.status
        headers = dict(exc.response.headers) if exc.response is not None else {}
        code = int(getattr(status, "code", 0) or (exc.response.status_code if exc.response else 0))
        raise errors.from_status(
            code, str(status.reason or ""), str(status.message or "")[:1024], headers
        ) from None
    except httpx2.HTTPStatusError as exc:  # an error answer whose body is not a Status (429)
        answer = exc.response
        raise errors.from_status(
            answer.status_code, answer.reason_phrase, answer.text[:1024], dict(answer.headers)
        ) from None
    except (httpx2.TransportError, OSError) as exc:  # no answer: resets, timeouts, TLS
        raise errors.RetryableError(0, type(exc).__name__, str(exc)[:256]) from None
    except ValueError as exc:  # an error answer that is not a Status (a proxy's page)
        raise errors.RetryableError(0, "UndecodableAnswer", str(exc)[:256]) from None


class RecordApi:
    """`RecordSink` of the publisher: creates ExecFailure records."""

    def __init__(self, api: Any, namespace: str) -> None:
        self._api = api
        self._namespace = namespace

    def create(self, body: dict[str, Any]) -> None:
        with translate():
            self._api.create(_record_resource()(body), namespace=self._namespace)


def _snake(obj: Any) -> Any:
    """A lightkube model (camelCase attributes) as the snake_case shape the pod cache
    reads (that of the official client's models), for the few fields it uses."""
    if obj is None:
        return None
    meta = obj.metadata
    refs = [
        SimpleNamespace(kind=r.kind, name=r.name, controller=bool(r.controller))
        for r in (meta.ownerReferences or [])
    ]
    status = getattr(obj, "status", None)

    def statuses(attr: str) -> list[SimpleNamespace]:
        return [
            SimpleNamespace(container_id=s.containerID, name=s.name, image=s.image)
            for s in (getattr(status, attr, None) or [])
        ]

    return SimpleNamespace(
        metadata=SimpleNamespace(
            uid=meta.uid,
            name=meta.name,
            namespace=meta.namespace,
            labels=meta.labels,
            owner_references=refs,
            resource_version=meta.resourceVersion,
        ),
        status=SimpleNamespace(
            container_statuses=statuses("containerStatuses"),
            init_container_statuses=statuses("initContainerStatuses"),
            ephemeral_container_statuses=statuses("ephemeralContainerStatuses"),
        ),
    )


class PodApi:
    """The calls `attribution.kube.KubernetesPodCache` makes (core, apps and batch API
    objects and a watch stream), served by lightkube."""

    def __init__(self, api: Any) -> None:
        self._api = api

    def list_pod_for_all_namespaces(self, field_selector: str) -> Any:
        from lightkube.resources.core_v1 import Pod

        listing = self._api.list(Pod, namespace="*", fields=_fields(field_selector))
        items = [_snake(p) for p in listing]
        return SimpleNamespace(
            items=items, metadata=SimpleNamespace(resource_version=listing.resourceVersion)
        )

    def watch_stream(
        self,
        _list: Any,
        field_selector: str,
        resource_version: str,
        timeout_seconds: int,
    ) -> Iterator[dict[str, Any]]:
        from lightkube.resources.core_v1 import Pod

        for kind, pod in self._api.watch(
            Pod,
            namespace="*",
            fields=_fields(field_selector),
            resource_version=resource_version,
            server_timeout=timeout_seconds,
        ):
            yield {"type": kind, "object": _snake(pod)}

    def read_namespaced_replica_set(self, name: str, namespace: str) -> Any:
        from lightkube.resources.apps_v1 import ReplicaSet

        return _snake(self._api.get(ReplicaSet, name, namespace=namespace))

    def read_namespaced_job(self, name: str, namespace: str) -> Any:
        from lightkube.resources.batch_v1 import Job

        return _snake(self._api.get(Job, name, namespace=namespace))


def _fields(selector: str) -> dict[str, str]:
    """`a=b,c=d` -> {"a": "b", "c": "d"} (lightkube builds the selector again)."""
    return dict(part.split("=", 1) for part in selector.split(",") if "=" in part)
