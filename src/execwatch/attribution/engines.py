"""Docker and Podman containers by id, from their engines, in memory for the event path.

Each engine socket gets one watcher thread: it lists the engine's containers at start,
then follows the events stream (create, start, destroy) in windows of `window` seconds
(the engine closes each window's stream, so no read waits unbounded). A create event
already carries the name, the image as typed and the labels; the thread then inspects the
container for the image id and the graph driver's directories (its root, which the
diagnosis opens once the container is gone). Entries outlive the container (TTL), so a
`--rm` container gone in milliseconds is still named. Lookups never touch the socket.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import logging
import os
import pwd
import queue
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from cachetools import TTLCache

from execwatch.attribution.engine_api import (
    ContainerEvent,
    EngineClient,
    EngineContainer,
    EngineError,
    EngineNotFound,
    default_docker_socket,
)
from execwatch.attribution.podman_storage import ROOTFUL_GRAPH_ROOT, PodmanStorage

log = logging.getLogger(__name__)

PODMAN_ROOTFUL_SOCKET = "/run/podman/podman.sock"
PODMAN_ROOTLESS_SOCKETS = "/run/user/*/podman/podman.sock"
UNKNOWN_TTL = 2.0  # seconds an id waited for in vain is not waited for again
PODMAN_STORAGE_ENV = "EXECWATCH_PODMAN_STORAGE"  # rootful Podman's graph root, if not the default


@dataclass(frozen=True, slots=True)
class EngineConfig:
    cache_size: int = 4096  # containers remembered per engine
    ttl: float = 3600.0  # how long a container is remembered, removed or not
    window: float = 5.0  # seconds of events per stream; also how often a down engine is retried
    timeout: float = 2.0  # each inspect or list
    list_limit: int = 4096
    inspect_queue: int = 1024  # containers waiting for their inspect


@dataclass(frozen=True, slots=True)
class EngineSocket:
    runtime: str  # "docker" or "podman"
    path: str
    user: str | None = None  # a rootless engine's owner


@dataclass(frozen=True, slots=True)
class Named:
    """What attribution reports of an engine's container."""

    container: EngineContainer
    runtime: str
    user: str | None


class EngineWatcher:
    """One engine: a thread following its events, another inspecting what they name, both
    filling a TTL + LRU cache by container id."""

    def __init__(self, engine: EngineSocket, config: EngineConfig | None = None) -> None:
        self.engine = engine
        self.config = config or EngineConfig()
        self._client = EngineClient(engine.path, self.config.timeout)
        self._cache: TTLCache[str, EngineContainer] = TTLCache(
            self.config.cache_size, self.config.ttl
        )
        # Ids waited for in vain (another engine's, or never reported): not waited for again
        # until they expire.
        self._unknown: TTLCache[str, bool] = TTLCache(self.config.cache_size, UNKNOWN_TTL)
        self._pod_names: TTLCache[str, str] = TTLCache(self.config.cache_size, self.config.ttl)
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._inspects: queue.Queue[ContainerEvent | None] = queue.Queue(self.config.inspect_queue)
        self._threads: list[threading.Thread] = []
        self.ready = threading.Event()  # set once the first list succeeded or failed
        self.up = False  # the engine answered its last call

    def start(self) -> None:
        name = f"engine-{self.engine.runtime}"
        self._threads = [
            threading.Thread(target=self._run, name=name, daemon=True),
            threading.Thread(target=self._inspect_loop, name=f"{name}-inspect", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def close(self) -> None:
        self._stop.set()
        self._client.cancel_streams()
        with contextlib.suppress(queue.Full):
            self._inspects.put_nowait(None)
        for thread in self._threads:
            thread.join(timeout=self.config.window + self.config.timeout + 1)
        self._threads = []

    def get(self, container_id: str, wait: float = 0.0) -> EngineContainer | None:
        """What is known of the container; while the engine is up and the container not yet
        inspected, wait up to `wait` seconds for its event and inspect to come in."""
        deadline = time.monotonic() + wait
        with self._changed:
            if container_id in self._unknown:
                return self._cache.get(container_id)
            while True:
                found = self._cache.get(container_id)
                left = deadline - time.monotonic()
                if (found is not None and found.inspected) or not self.up:
                    return found
                if left <= 0:
                    if wait > 0:
                        self._unknown[container_id] = True
                    return found
                self._changed.wait(left)

    def _put(self, found: EngineContainer) -> None:
        with self._changed:
            known = self._cache.get(found.container_id)
            self._cache[found.container_id] = _merge(known, found)
            self._changed.notify_all()

    def _set_up(self, up: bool) -> None:
        with self._changed:
            self.up = up
            self._changed.notify_all()
        self.ready.set()

    def _run(self) -> None:
        warned = False
        while not self._stop.is_set():
            try:
                since = int(time.time())
                self._list()
                self._set_up(True)
                if warned:
                    log.info("container engine answers", extra={"socket": self.engine.path})
                warned = False
                self._follow(since)
            except EngineError as exc:
                if self._stop.is_set():
                    return  # close() ended the stream
                self._set_up(False)
                if not warned:
                    log.warning(
                        "container engine not reachable: its containers are reported by id",
                        extra={"socket": self.engine.path, "error": str(exc)},
                    )
                    warned = True
                self._stop.wait(self.config.window)

    def _list(self) -> None:
        for cid in self._client.container_ids(self.config.list_limit):
            if self._stop.is_set():
                return
            with contextlib.suppress(EngineNotFound):
                self._put(self._with_pod(self._client.container(cid), self._pod_id(cid)))

    def _follow(self, since: int) -> None:
        while not self._stop.is_set():
            until = int(time.time() + self.config.window)
            for event in self._client.events(since, until):
                self._on_event(event)
                if self._stop.is_set():
                    return
            since = until

    def _on_event(self, event: ContainerEvent) -> None:
        """The event's own attributes at once; the inspect on the other thread."""
        if event.action == "destroy":
            return  # kept until its TTL: a failure is often looked up after the removal
        self._put(
            EngineContainer(
                event.container_id,
                event.name,
                event.image,
                labels=event.labels,
                pod_id=event.pod_id,
            )
        )
        try:
            self._inspects.put_nowait(event)
        except queue.Full:
            log.debug("inspect queue full", extra={"container_id": event.container_id})

    def _inspect_loop(self) -> None:
        while (event := self._inspects.get()) is not None:
            known = self.get(event.container_id)
            if known is None or not known.inspected:
                self._inspect(event)

    def _inspect(self, event: ContainerEvent) -> None:
        try:
            found = self._client.container(event.container_id)
        except EngineError as exc:  # removed already (or, Podman, still being created):
            log.debug("inspect failed", extra={"container_id": event.container_id, "error": exc})
            self._image_only(event)  # its image's layers are its root
            return
        self._put(self._with_pod(found, event.pod_id))  # Podman's events say the pod, or none

    def _pod_id(self, container_id: str) -> str | None:
        """A listed Podman container's pod (no event told it): libpod's own inspect."""
        if self.engine.runtime != "podman":
            return None
        with contextlib.suppress(EngineError):
            return self._client.podman_pod_id(container_id)
        return None

    def _with_pod(self, found: EngineContainer, pod_id: str | None) -> EngineContainer:
        """A Podman container with its pod's name (libpod's endpoint: the Docker API has
        no pods); put in the cache together with the inspect, so a lookup waiting for the
        inspect gets the pod too."""
        if pod_id is None:
            return found
        return dataclasses.replace(found, pod_id=pod_id, pod_name=self._pod_name(pod_id))

    def _pod_name(self, pod_id: str) -> str | None:
        with self._changed:
            known = self._pod_names.get(pod_id)
        if known is not None:
            return known
        try:
            name = self._client.podman_pod_name(pod_id)
        except EngineError:
            return None
        if name is not None:
            with self._changed:
                self._pod_names[pod_id] = name
        return name

    def _image_only(self, event: ContainerEvent) -> None:
        image_id, layers = None, None
        if event.image:
            with contextlib.suppress(EngineError):
                image_id, layers = self._client.image_layers(event.image)
        found = EngineContainer(
            event.container_id, image_id=image_id, layers=layers, inspected=True
        )
        self._put(self._with_pod(found, event.pod_id))


def _merge(old: EngineContainer | None, new: EngineContainer) -> EngineContainer:
    if old is None:
        return new
    changes = {
        f.name: getattr(new, f.name)
        for f in dataclasses.fields(new)
        if getattr(new, f.name) not in (None, {}, (), False)
    }
    return dataclasses.replace(old, **changes)


class Engines:
    """The host's engines: Docker (DOCKER_HOST or /var/run/docker.sock), rootful Podman and
    each rootless user's Podman whose service socket exists at start; for a Podman
    container no service named, Podman's on-disk state (root's, or the cgroup's user's)."""

    def __init__(
        self,
        sockets: Iterable[EngineSocket] | None = None,
        config: EngineConfig | None = None,
        podman_storage: Path | None = None,
    ) -> None:
        self._sockets = list(sockets) if sockets is not None else None
        self._config = config or EngineConfig()
        self._watchers: list[EngineWatcher] = []
        root = podman_storage or Path(os.environ.get(PODMAN_STORAGE_ENV, ROOTFUL_GRAPH_ROOT))
        self._rootful_storage = PodmanStorage(root)
        self._from_storage: TTLCache[tuple[str, int | None], EngineContainer] = TTLCache(
            self._config.cache_size, self._config.ttl
        )
        self._storage_lock = threading.Lock()

    def start(self) -> None:
        sockets = self._sockets if self._sockets is not None else host_engine_sockets()
        self._watchers = [EngineWatcher(s, self._config) for s in sockets]
        for watcher in self._watchers:
            watcher.start()

    def close(self) -> None:
        for watcher in self._watchers:
            watcher.close()

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for watcher in self._watchers:
            watcher.ready.wait(max(0.0, deadline - time.monotonic()))

    def lookup(
        self, runtime: str | None, container_id: str, uid: int | None = None, wait: float = 0.0
    ) -> Named | None:
        """From memory; up to `wait` seconds for an engine that is up to report a container
        it is starting. `uid`: the owner the cgroup path names (a rootless engine's)."""
        for watcher in self._watchers:
            engine = watcher.engine
            if runtime is not None and engine.runtime != runtime:
                continue
            if engine.user is not None and (uid is None or engine.user != _user_name(uid)):
                continue  # a rootless engine's containers are in its user's user@UID.service
            found = watcher.get(container_id, wait)
            if found is not None:
                return Named(found, engine.runtime, engine.user)
        return self._podman_state(container_id, uid) if runtime == "podman" else None

    def _podman_state(self, container_id: str, uid: int | None) -> Named | None:
        """Where no Podman service told: the user's (or root's) containers/storage state,
        read once per container and kept as the watchers keep theirs."""
        user = _user_name(uid) if uid is not None else None
        key = (container_id, uid)
        with self._storage_lock:
            found = self._from_storage.get(key)
        if found is None:
            storage = PodmanStorage.of_user(uid) if uid is not None else self._rootful_storage
            found = storage.container(container_id) if storage is not None else None
            if found is None:
                return None
            with self._storage_lock:
                self._from_storage[key] = found
        return Named(found, "podman", user)


def host_engine_sockets(environ: Mapping[str, str] = os.environ) -> list[EngineSocket]:
    found = [EngineSocket("docker", default_docker_socket(environ))]
    podman = environ.get("EXECWATCH_PODMAN_SOCKET", PODMAN_ROOTFUL_SOCKET)
    found.append(EngineSocket("podman", podman))
    for path in sorted(glob.glob(PODMAN_ROOTLESS_SOCKETS))[:256]:
        uid = path.split("/")[3]
        if uid.isdigit() and uid != "0":
            found.append(EngineSocket("podman", path, _user_name(int(uid))))
    return [s for s in found if os.path.exists(s.path) or s.runtime == "docker"]


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)
