"""A small typed client of the Docker Engine API (which Podman's service speaks too).

Only what attribution needs: a container's name, image, labels and graph-driver
directories (`GET /containers/<id>/json`), an image's (`GET /images/<ref>/json`), the list
of containers, the events stream, and a Podman container's pod (libpod's own
`/libpod/containers/<id>/json` and `/libpod/pods/<id>/json`, under the same prefix).
Plain HTTP/1.1 over a Unix socket with the standard library; every read has a deadline
and every answer a size bound.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import threading
import urllib.parse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

API_VERSION = "v1.40"  # Docker 19.03 and later, and Podman's compatible service
MAX_BODY = 4 << 20  # a container's inspect is a few KiB; a list of many, a few MiB
MAX_EVENT_LINE = 1 << 20
MAX_LAYERS = 500  # overlayfs's own limit of lower layers
COMPOSE_PROJECT = "com.docker.compose.project"
COMPOSE_SERVICE = "com.docker.compose.service"
CONTAINER_EVENTS = ("create", "start", "destroy")
# What an event's attributes hold besides the container's labels (Docker, Podman).
EVENT_ATTRIBUTES = frozenset({"name", "image", "exitCode", "containerExitCode", "podId"})


class EngineError(Exception):
    """The engine did not answer, or answered something this client cannot read."""


class EngineNotFound(EngineError):
    """The engine answered 404: it does not know this container or image."""


@dataclass(frozen=True, slots=True)
class Layers:
    """Where the engine's graph driver keeps a root: the overlay directories, top first."""

    upper: str | None = None
    lower: tuple[str, ...] = ()

    @property
    def top_first(self) -> tuple[str, ...]:
        return ((self.upper,) if self.upper else ()) + self.lower


@dataclass(frozen=True, slots=True)
class EngineContainer:
    """One container as its engine names it."""

    container_id: str
    name: str | None = None
    image: str | None = None  # as the user typed it (Config.Image)
    image_id: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    layers: Layers | None = None
    inspected: bool = False  # from an inspect, not only from an event's attributes
    pod_id: str | None = None  # a Podman pod's
    pod_name: str | None = None

    @property
    def compose_project(self) -> str | None:
        return self.labels.get(COMPOSE_PROJECT)

    @property
    def compose_service(self) -> str | None:
        return self.labels.get(COMPOSE_SERVICE)


@dataclass(frozen=True, slots=True)
class ContainerEvent:
    action: str
    container_id: str
    name: str | None
    image: str | None
    labels: Mapping[str, str]
    time_nano: int
    pod_id: str | None = None  # Podman's podId attribute


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def socket_from_host(docker_host: str | None) -> str | None:
    """The Unix socket a DOCKER_HOST value names (`unix:///path`); None for tcp:// and
    ssh://, which this client does not speak."""
    if not docker_host:
        return None
    if docker_host.startswith("unix://"):
        return docker_host[len("unix://") :] or None
    if docker_host.startswith("/"):
        return docker_host
    return None


class EngineClient:
    """One engine's socket. Each call opens its own connection: no state to share."""

    def __init__(self, socket_path: str, timeout: float = 2.0) -> None:
        self.socket_path = socket_path
        self.timeout = timeout
        self._lock = threading.Lock()
        self._streams: set[_UnixConnection] = set()

    def cancel_streams(self) -> None:
        """Ends every events stream now (from another thread): its reader sees the end."""
        with self._lock:
            for conn in self._streams:
                if conn.sock is not None:
                    with contextlib.suppress(OSError):
                        conn.sock.shutdown(socket.SHUT_RDWR)

    def container(self, ref: str) -> EngineContainer:
        data = self._get_json(f"/containers/{_quote(ref)}/json")
        return container_from_inspect(data)

    def image_layers(self, ref: str) -> tuple[str | None, Layers | None]:
        """(image id, graph-driver layers) of an image, by id or reference."""
        data = self._get_json(f"/images/{_quote(ref)}/json")
        if not isinstance(data, dict):
            raise EngineError("image inspect is not an object")
        image_id = data.get("Id")
        return (image_id if isinstance(image_id, str) else None), _layers(data)

    def podman_pod_id(self, container_id: str) -> str | None:
        """The id of the Podman pod a container belongs to (libpod's own inspect)."""
        pod = _object(self._get_json(f"/libpod/containers/{_quote(container_id)}/json")).get("Pod")
        return pod if isinstance(pod, str) and pod else None

    def podman_pod_name(self, pod_id: str) -> str | None:
        name = _object(self._get_json(f"/libpod/pods/{_quote(pod_id)}/json")).get("Name")
        return name if isinstance(name, str) and name else None

    def container_ids(self, limit: int = 4096) -> list[str]:
        data = self._get_json("/containers/json?all=1")
        if not isinstance(data, list):
            raise EngineError("container list is not an array")
        ids = [c.get("Id") for c in data[:limit] if isinstance(c, dict)]
        return [i for i in ids if isinstance(i, str)]

    def events(self, since: int, until: int) -> Iterator[ContainerEvent]:
        """Container create/start/destroy events from `since` to `until` (seconds since the
        epoch): the engine closes the stream at `until`, so no read waits longer."""
        filters = json.dumps({"type": ["container"], "event": list(CONTAINER_EVENTS)})
        query = urllib.parse.urlencode({"since": since, "until": until, "filters": filters})
        conn = _UnixConnection(self.socket_path, max(1.0, until - since) + self.timeout)
        with self._lock:
            self._streams.add(conn)
        try:
            response = self._request(conn, f"/events?{query}")
            if response.status != 200:
                raise EngineError(f"events: HTTP {response.status}")
            while line := response.readline(MAX_EVENT_LINE):
                event = _event(line)
                if event is not None:
                    yield event
        except (OSError, http.client.HTTPException) as exc:
            raise EngineError(f"events: {exc}") from exc
        finally:
            with self._lock:
                self._streams.discard(conn)
            conn.close()

    def ping(self) -> None:
        conn = _UnixConnection(self.socket_path, self.timeout)
        try:
            response = self._request(conn, "/_ping")
            response.read(64)
            if response.status != 200:
                raise EngineError(f"ping: HTTP {response.status}")
        except (OSError, http.client.HTTPException) as exc:
            raise EngineError(f"{self.socket_path}: {exc}") from exc
        finally:
            conn.close()

    def _get_json(self, path: str) -> Any:
        conn = _UnixConnection(self.socket_path, self.timeout)
        try:
            response = self._request(conn, path)
            body = response.read(MAX_BODY + 1)
        except (OSError, http.client.HTTPException) as exc:
            raise EngineError(f"{path}: {exc}") from exc
        finally:
            conn.close()
        if response.status == 404:
            raise EngineNotFound(path)
        if response.status != 200:
            raise EngineError(f"{path}: HTTP {response.status}")
        if len(body) > MAX_BODY:
            raise EngineError(f"{path}: answer larger than {MAX_BODY} bytes")
        try:
            return json.loads(body)
        except (ValueError, RecursionError) as exc:
            raise EngineError(f"{path}: {exc}") from exc

    @staticmethod
    def _request(conn: _UnixConnection, path: str) -> http.client.HTTPResponse:
        conn.request("GET", f"/{API_VERSION}{path}", headers={"Host": "localhost"})
        return conn.getresponse()


def container_from_inspect(data: Any) -> EngineContainer:
    if not isinstance(data, dict) or not isinstance(data.get("Id"), str):
        raise EngineError("container inspect has no Id")
    config = _object(data.get("Config"))
    name = data.get("Name")
    image = config.get("Image")
    image_id = data.get("Image")
    return EngineContainer(
        container_id=data["Id"],
        name=name.lstrip("/") if isinstance(name, str) else None,
        image=image if isinstance(image, str) else None,
        image_id=image_id if isinstance(image_id, str) else None,
        labels=_labels(config.get("Labels")),
        layers=_layers(data),
        inspected=True,
    )


def _layers(data: Mapping[str, Any]) -> Layers | None:
    driver = data.get("GraphDriver")
    if not isinstance(driver, dict) or not isinstance(driver.get("Data"), dict):
        return None
    values = driver["Data"]
    upper = values.get("UpperDir")
    lower = values.get("LowerDir")
    lowers = tuple(p for p in lower.split(":") if p) if isinstance(lower, str) else ()
    if len(lowers) > MAX_LAYERS:
        return None
    layers = Layers(upper if isinstance(upper, str) and upper else None, lowers)
    return layers if layers.top_first else None


def _labels(raw: Any) -> dict[str, str]:
    if not isinstance(raw, dict):
        return {}
    return {k: v for k, v in raw.items() if isinstance(k, str) and isinstance(v, str)}


def _event(line: bytes) -> ContainerEvent | None:
    try:
        data = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or data.get("Type") != "container":
        return None
    actor = _object(data.get("Actor"))
    attributes = _labels(actor.get("Attributes"))
    cid, action = actor.get("ID"), data.get("Action")
    if not isinstance(cid, str) or not isinstance(action, str):
        return None
    when = data.get("timeNano")
    return ContainerEvent(
        action=action,
        container_id=cid,
        name=attributes.get("name"),
        image=attributes.get("image"),
        labels={k: v for k, v in attributes.items() if k not in EVENT_ATTRIBUTES},
        time_nano=when if isinstance(when, int) else 0,
        pod_id=attributes.get("podId") or None,
    )


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _quote(ref: str) -> str:
    return urllib.parse.quote(ref, safe="")


def default_docker_socket(environ: Mapping[str, str] = os.environ) -> str:
    return socket_from_host(environ.get("DOCKER_HOST")) or "/var/run/docker.sock"
