"""A minimal CRI client: which pod and image a container id belongs to.

It speaks runtime.v1 over the node's CRI socket with grpcio and the protobuf subset
in api.proto. Every call carries a deadline, so an absent or hung runtime costs the
event path at most that deadline; the Attributor adds a back-off on top.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import grpc  # type: ignore[import-untyped]
from google.protobuf.message import Message

from execwatch.attribution.cri import api_pb2 as pb
from execwatch.attribution.metadata import (
    LABEL_CONTAINER_NAME,
    LABEL_POD_NAME,
    LABEL_POD_NAMESPACE,
    LABEL_POD_UID,
    SANDBOX_CONTAINER_NAME,
    ContainerRole,
    CriContainer,
    CriUnavailable,
)

log = logging.getLogger(__name__)

SERVICE = "/runtime.v1.RuntimeService/"
SOCKETS_ENV = "EXECWATCH_CRI_SOCKETS"
DEFAULT_SOCKETS: tuple[Path, ...] = (
    Path("/run/containerd/containerd.sock"),
    Path("/var/run/crio/crio.sock"),
    Path("/run/crio/crio.sock"),
    Path("/run/cri-dockerd.sock"),
    Path("/var/run/cri-dockerd.sock"),
    Path("/run/k3s/containerd/containerd.sock"),
)
_NOT_FOUND = (grpc.StatusCode.NOT_FOUND,)
_UNKNOWN_ID_MESSAGES = ("not found", "does not exist", "no such", "unknown")

Req = TypeVar("Req", bound=Message)
Resp = TypeVar("Resp", bound=Message)


def configured_sockets() -> list[Path]:
    """EXECWATCH_CRI_SOCKETS=path[:path...] overrides detection (k3s, microk8s, tests)."""
    value = os.environ.get(SOCKETS_ENV, "")
    return [Path(p) for p in value.split(":") if p]


def detect_sockets(candidates: tuple[Path, ...] = DEFAULT_SOCKETS) -> list[Path]:
    """CRI sockets present on this node, in preference order, duplicates (symlinks) once."""
    found: list[Path] = []
    seen: set[str] = set()
    for path in candidates:
        try:
            real = os.path.realpath(path)
            if Path(real).is_socket() and real not in seen:
                seen.add(real)
                found.append(path)
        except OSError:
            continue
    return found


class CriClient:
    """One runtime socket. Thread-safe: grpc channels are."""

    def __init__(self, socket_path: Path, *, runtime_name: str | None = None) -> None:
        self.socket_path = socket_path
        self._channel = grpc.insecure_channel(
            f"unix://{socket_path}",
            options=[("grpc.max_receive_message_length", 16 << 20)],
        )
        self._runtime_name = runtime_name
        self._lock = threading.Lock()

    def _call(self, method: str, request: Req, response: type[Resp], deadline: float) -> Resp:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise CriUnavailable(f"{self.socket_path}: no time left for {method}")
        stub: Callable[..., Any] = self._channel.unary_unary(
            SERVICE + method,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=response.FromString,
        )
        result: Resp = stub(request, timeout=remaining)
        return result

    def runtime_name(self, deadline: float) -> str:
        """containerd, cri-o, docker...: from the Version call, cached."""
        with self._lock:
            if self._runtime_name is not None:
                return self._runtime_name
        try:
            version = self._call("Version", pb.VersionRequest(), pb.VersionResponse, deadline)
        except grpc.RpcError as exc:
            raise CriUnavailable(f"{self.socket_path}: {_describe(exc)}") from exc
        name = _normalise_runtime(version.runtime_name)
        with self._lock:
            self._runtime_name = name
        return name

    def version(self, timeout: float) -> pb.VersionResponse:
        deadline = time.monotonic() + timeout
        return self._call("Version", pb.VersionRequest(), pb.VersionResponse, deadline)

    def container(self, container_id: str, timeout: float) -> CriContainer | None:
        """Container or sandbox by full id, all calls within ``timeout`` seconds.

        None: the runtime does not know the id. CriUnavailable: it could not say.
        """
        deadline = time.monotonic() + timeout
        try:
            found = self._call(
                "ListContainers",
                pb.ListContainersRequest(filter=pb.ContainerFilter(id=container_id)),
                pb.ListContainersResponse,
                deadline,
            )
            matches = [c for c in found.containers if c.id == container_id]
            if matches:
                return self._from_container(matches[0], deadline)
            sandbox = self._sandbox(container_id, deadline)
            if sandbox is not None:
                return self._from_sandbox(sandbox, deadline)
        except grpc.RpcError as exc:
            if _is_transport_failure(exc):
                raise CriUnavailable(f"{self.socket_path}: {_describe(exc)}") from exc
            log.info(
                "runtime refused a lookup",
                extra={"container_id": container_id, "error": _describe(exc)},
            )
        return None

    def _sandbox(self, sandbox_id: str, deadline: float) -> pb.PodSandboxStatus | None:
        try:
            resp = self._call(
                "PodSandboxStatus",
                pb.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id),
                pb.PodSandboxStatusResponse,
                deadline,
            )
        except grpc.RpcError as exc:
            if _is_not_found(exc):
                return None
            raise
        return resp.status if resp.status.id == sandbox_id else None

    def _from_container(self, c: pb.Container, deadline: float) -> CriContainer:
        labels = dict(c.labels)
        sandbox = self._sandbox(c.pod_sandbox_id, deadline) if c.pod_sandbox_id else None
        pod_labels: Mapping[str, str] = dict(sandbox.labels) if sandbox is not None else {}
        meta = sandbox.metadata if sandbox is not None else None
        image = c.image.user_specified_image or c.image.image or c.image_ref or None
        if image and image.startswith("sha256:"):
            image = self._status_image(c.id, deadline) or image
        return CriContainer(
            container_id=c.id,
            pod_uid=labels.get(LABEL_POD_UID) or (meta.uid if meta else None) or None,
            pod_name=labels.get(LABEL_POD_NAME) or (meta.name if meta else None) or None,
            namespace=labels.get(LABEL_POD_NAMESPACE) or (meta.namespace if meta else None) or None,
            name=labels.get(LABEL_CONTAINER_NAME) or c.metadata.name or None,
            image=image,
            role=ContainerRole.REGULAR,
            runtime=self._runtime_or_none(deadline),
            pod_labels=pod_labels,
        )

    def _status_image(self, container_id: str, deadline: float) -> str | None:
        """ListContainers may give the image id; ContainerStatus has the name the pod used."""
        try:
            status = self._call(
                "ContainerStatus",
                pb.ContainerStatusRequest(container_id=container_id),
                pb.ContainerStatusResponse,
                deadline,
            ).status
        except (grpc.RpcError, CriUnavailable):
            return None
        return status.image.user_specified_image or status.image.image or None

    def _from_sandbox(self, s: pb.PodSandboxStatus, deadline: float) -> CriContainer:
        labels = dict(s.labels)
        return CriContainer(
            container_id=s.id,
            pod_uid=s.metadata.uid or labels.get(LABEL_POD_UID) or None,
            pod_name=s.metadata.name or labels.get(LABEL_POD_NAME) or None,
            namespace=s.metadata.namespace or labels.get(LABEL_POD_NAMESPACE) or None,
            name=SANDBOX_CONTAINER_NAME,
            image=None,
            role=ContainerRole.SANDBOX,
            runtime=self._runtime_or_none(deadline),
            pod_labels=labels,
        )

    def _runtime_or_none(self, deadline: float) -> str | None:
        try:
            return self.runtime_name(deadline)
        except CriUnavailable:
            return None

    def close(self) -> None:
        self._channel.close()


def _normalise_runtime(name: str) -> str:
    lowered = name.lower()
    for known in ("containerd", "cri-o", "docker"):
        if known in lowered:
            return known
    return lowered or "unknown"


def _is_not_found(exc: grpc.RpcError) -> bool:
    code = exc.code() if hasattr(exc, "code") else None
    if code in _NOT_FOUND:
        return True
    details = (exc.details() or "") if hasattr(exc, "details") else ""
    return code == grpc.StatusCode.UNKNOWN and any(m in details for m in _UNKNOWN_ID_MESSAGES)


def _is_transport_failure(exc: grpc.RpcError) -> bool:
    """The runtime is down or hung (back off), as opposed to refusing this one request."""
    code = exc.code() if hasattr(exc, "code") else None
    return code in (
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.UNIMPLEMENTED,
        None,
    )


def _describe(exc: grpc.RpcError) -> str:
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    return f"{getattr(code, 'name', code)}: {details}"


class CriContainers:
    """All CRI sockets of the node as one ContainerSource; the first that knows an id wins."""

    def __init__(self, sockets: list[Path] | None = None) -> None:
        if sockets is None:
            sockets = configured_sockets() or detect_sockets()
        self.clients = [CriClient(p) for p in sockets]
        log.info("CRI sockets", extra={"sockets": [str(p) for p in sockets]})

    def container(self, container_id: str, timeout: float) -> CriContainer | None:
        deadline = time.monotonic() + timeout
        failures: list[str] = []
        for client in self.clients:
            try:
                found = client.container(container_id, max(deadline - time.monotonic(), 0.0))
            except CriUnavailable as exc:
                failures.append(str(exc))
                continue
            if found is not None:
                return found
        if failures and len(failures) == len(self.clients):
            raise CriUnavailable("; ".join(failures))
        return None

    def close(self) -> None:
        for client in self.clients:
            client.close()
