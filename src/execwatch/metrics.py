"""Prometheus metrics of the node side (trace and agent).

Kernel counts are read from the BPF maps at scrape time, so they are exact even when
the ring buffer overflowed; user-space counters say what was delivered and diagnosed.
Everything lives in one registry object: nothing global. `serve` is the HTTP server of
/metrics and /healthz for trace, agent and handler alike.
"""

from __future__ import annotations

import collections
import errno as errno_mod
import gzip
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from execwatch.record import Reason

log = logging.getLogger(__name__)


class KernelCounters(Protocol):
    def errno_totals(self) -> dict[int, int]: ...
    def death_totals(self) -> dict[str, int]: ...
    def stats(self) -> dict[str, int]: ...


# None when healthy, else a one-line reason: see pipeline.Heartbeat.problem.
HealthCheck = Callable[[], "str | None"]


@dataclass(frozen=True)
class ServerLimits:
    """What one scraper (or any pod that can reach the port) may hold of the server.

    One thread serves every connection through epoll. Past `max_connections`, the oldest
    connection still waiting for its request, of the address holding the most, is closed
    at once (or the new one, if every slot is busy answering). A request must arrive
    within `read_timeout` and its answer be taken within `write_timeout`. Idle or slow
    peers cost a socket for a few seconds at most, never a thread."""

    max_connections: int = 32
    read_timeout: float = 5.0
    write_timeout: float = 10.0
    max_request: int = 8192


@dataclass
class ServerMetrics:
    """Connections the metrics server closed before answering them, by why."""

    registry: CollectorRegistry

    def __post_init__(self) -> None:
        self.dropped = Counter(
            "execwatch_metrics_connections_dropped",
            "Connections to the metrics/healthz server closed without an answer, by type "
            "(over the connection cap, timed out, request too large).",
            ["type"],
            registry=self.registry,
        )


def serve(
    address: tuple[str, int],
    registry: CollectorRegistry,
    health: HealthCheck | None = None,
    limits: ServerLimits = ServerLimits(),
) -> MetricsServer:
    """Serve `registry` on /metrics in a background thread; call .shutdown() to stop.

    With `health`, /healthz answers 200 or 503 with its reason (the liveness probe)."""
    metrics = ServerMetrics(registry)
    server = MetricsServer(address, _Answers(registry, health), limits, metrics)
    server.start()
    return server


@dataclass(frozen=True)
class _Answers:
    registry: CollectorRegistry
    health: HealthCheck | None

    def __call__(self, method: str, path: str, headers: dict[str, str]) -> bytes:
        if method not in ("GET", "HEAD"):
            return _response("405 Method Not Allowed", "text/plain", b"GET or HEAD\n", method)
        if path == "/healthz" and self.health is not None:
            problem = self.health()
            status = "503 Service Unavailable" if problem else "200 OK"
            text = f"{problem or 'ok'}\n".encode()
            return _response(status, "text/plain; charset=utf-8", text, method)
        encoder, content_type = choose_encoder(headers.get("accept", ""))
        body = encoder(self.registry)
        extra: tuple[tuple[str, str], ...] = ()
        if "gzip" in headers.get("accept-encoding", ""):
            body, extra = gzip.compress(body), (("Content-Encoding", "gzip"),)
        return _response("200 OK", content_type, body, method, extra)


def _response(
    status: str,
    content_type: str,
    body: bytes,
    method: str,
    extra: tuple[tuple[str, str], ...] = (),
) -> bytes:
    head = [f"HTTP/1.1 {status}", f"Content-Type: {content_type}"]
    head += [f"Content-Length: {len(body)}", "Connection: close"]
    head += [f"{k}: {v}" for k, v in extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + (b"" if method == "HEAD" else body)


_BAD_REQUEST = _response("400 Bad Request", "text/plain", b"bad request\n", "GET")
Answer = Callable[[str, str, dict[str, str]], bytes]


@dataclass
class _Conn:
    sock: socket.socket
    peer: str
    deadline: float
    inbox: bytearray = field(default_factory=bytearray)
    outbox: memoryview | None = None


class MetricsServer:
    """An HTTP/1.1 server for scrapes and probes: one request per connection, one thread."""

    def __init__(
        self,
        address: tuple[str, int],
        answer: Answer,
        limits: ServerLimits,
        metrics: ServerMetrics,
    ) -> None:
        host, port = address
        family, _, _, _, sockaddr = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind(sockaddr)
            self._listener.listen(128)
        except OSError:
            self._listener.close()
            raise
        self._listener.setblocking(False)
        self._answer = answer
        self._limits = limits
        self._dropped = metrics.dropped
        self._selector = selectors.DefaultSelector()
        self._conns: dict[int, _Conn] = {}
        self._wake_r, self._wake_w = socket.socketpair()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="metrics", daemon=True)

    @property
    def server_port(self) -> int:
        return int(self._listener.getsockname()[1])

    def start(self) -> None:
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._thread.start()

    def shutdown(self) -> None:
        self._stopping.set()
        self._wake_w.send(b"x")
        self._thread.join()
        for conn in list(self._conns.values()):
            self._close(conn)
        self._selector.close()
        for s in (self._listener, self._wake_r, self._wake_w):
            s.close()

    def _loop(self) -> None:
        while not self._stopping.is_set():
            for key, events in self._selector.select(self._next_timeout()):
                if key.fileobj is self._listener:
                    self._accept()
                elif key.fileobj is not self._wake_r and key.data.sock.fileno() >= 0:
                    self._serve(key.data, events)
            self._expire()

    def _next_timeout(self) -> float:
        if not self._conns:
            return 1.0
        soonest = min(c.deadline for c in self._conns.values())
        return max(0.0, soonest - time.monotonic())

    def _accept(self) -> None:
        while True:
            try:
                sock, peer = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # EMFILE and the like: the peer waits in the backlog
                time.sleep(0.1)  # the listener stays readable: do not spin
                return
            if len(self._conns) >= self._limits.max_connections and not self._evict():
                sock.close()
                self._dropped.labels("over_cap").inc()
                continue
            sock.setblocking(False)
            conn = _Conn(sock, str(peer[0]), time.monotonic() + self._limits.read_timeout)
            self._conns[sock.fileno()] = conn
            self._selector.register(sock, selectors.EVENT_READ, conn)

    def _evict(self) -> bool:
        """Close the oldest connection still waiting for its request, of the address that
        holds the most: a flood of idle connections cycles through its own slots, and
        the kubelet's probe or a scraper from another address is answered."""
        waiting = [c for c in self._conns.values() if c.outbox is None]
        if not waiting:
            return False
        greediest = collections.Counter(c.peer for c in waiting).most_common(1)[0][0]
        self._drop(next(c for c in waiting if c.peer == greediest), "over_cap")
        return True

    def _serve(self, conn: _Conn, events: int) -> None:
        try:
            if events & selectors.EVENT_READ and conn.outbox is None:
                self._read(conn)
            elif events & selectors.EVENT_WRITE and conn.outbox is not None:
                self._write(conn)
        except BlockingIOError:
            pass
        except OSError:  # reset by the peer
            self._close(conn)

    def _read(self, conn: _Conn) -> None:
        data = conn.sock.recv(4096)
        if not data:
            self._close(conn)
            return
        conn.inbox += data
        end = conn.inbox.find(b"\r\n\r\n")
        if end < 0:
            if len(conn.inbox) > self._limits.max_request:
                self._drop(conn, "oversize")
            return
        if end > self._limits.max_request:
            self._drop(conn, "oversize")
            return
        request = _parse(bytes(conn.inbox[:end]))
        reply = _BAD_REQUEST if request is None else self._reply(request)
        conn.outbox = memoryview(reply)
        conn.deadline = time.monotonic() + self._limits.write_timeout
        self._selector.modify(conn.sock, selectors.EVENT_WRITE)
        self._write(conn)

    def _reply(self, request: tuple[str, str, dict[str, str]]) -> bytes:
        try:
            return self._answer(*request)
        except Exception:  # a collector failed: this scrape fails, the server lives on
            log.exception("metrics: answering %s failed", request[1])
            return _response("500 Internal Server Error", "text/plain", b"error\n", request[0])

    def _write(self, conn: _Conn) -> None:
        assert conn.outbox is not None
        sent = conn.sock.send(conn.outbox)
        conn.outbox = conn.outbox[sent:]
        if not conn.outbox:
            self._close(conn)

    def _expire(self) -> None:
        now = time.monotonic()
        for conn in [c for c in self._conns.values() if c.deadline <= now]:
            self._drop(conn, "timeout")

    def _drop(self, conn: _Conn, why: str) -> None:
        self._dropped.labels(why).inc()
        self._close(conn)

    def _close(self, conn: _Conn) -> None:
        self._conns.pop(conn.sock.fileno(), None)
        self._selector.unregister(conn.sock)
        conn.sock.close()


def _parse(head: bytes) -> tuple[str, str, dict[str, str]] | None:
    """`METHOD PATH HTTP/1.x` and the headers, lower-cased; None if it is not that."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        return None
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep:
            return None
        headers[name.strip().lower()] = value.strip()
    return parts[0], urlsplit(parts[1]).path, headers


def errno_name(err: int) -> str:
    return errno_mod.errorcode.get(err, str(err))


class KernelCollector(Collector):
    def __init__(self, probe: KernelCounters) -> None:
        self._probe = probe

    def collect(self) -> Iterable[Metric]:
        failures = CounterMetricFamily(
            "execwatch_kernel_exec_failures",
            "Failed execve/execveat calls counted in the kernel (exact, every errno).",
            labels=["errno"],
        )
        for err, n in sorted(self._probe.errno_totals().items()):
            failures.add_metric([errno_name(err)], n)
        drops = CounterMetricFamily(
            "execwatch_kernel_dropped",
            "Events the kernel could not hand to user space, by type (counts stay exact).",
            labels=["type"],
        )
        for kind, n in self._probe.stats().items():
            drops.add_metric([kind], n)
        deaths = CounterMetricFamily(
            "execwatch_kernel_early_deaths",
            "Processes that died within the window after their exec, counted in the kernel"
            " (exact): a fatal signal (SIGSEGV) or an exit from the ELF loader (EXIT127).",
            labels=["status"],
        )
        for status, n in sorted(self._probe.death_totals().items()):
            deaths.add_metric([status], n)
        yield failures
        yield drops
        yield deaths

    def describe(self) -> Iterator[Metric]:
        return iter(())


class NodeMetrics:
    """The pipeline's observer: counts delivered events by errno and diagnosis."""

    def __init__(self, registry: CollectorRegistry, probe: KernelCounters | None = None) -> None:
        self.registry = registry
        self.events = Counter(
            "execwatch_events",
            "Failed execs delivered to user space, by errno and diagnosed reason.",
            ["errno", "reason"],
            registry=registry,
        )
        self.aggregated_events = Counter(
            "execwatch_events_aggregated",
            "Delivered failures folded into an earlier identical record instead of printed again.",
            registry=registry,
        )
        self.dropped_events = Counter(
            "execwatch_pipeline_dropped",
            "Failed execs user space could not diagnose because it was overloaded, by type "
            "(they are still reported, as Undiagnosed).",
            ["type"],
            registry=registry,
        )
        self.overruns = Counter(
            "execwatch_pipeline_overruns",
            "Diagnosis or attribution calls that overran their time budget (a slow or hung "
            "file system), by stage.",
            ["stage"],
            registry=registry,
        )
        if probe is not None:
            registry.register(KernelCollector(probe))

    def delivered(
        self, errno: int | str, reason: Reason, *, aggregated: bool, count: int = 1
    ) -> None:
        name = errno if isinstance(errno, str) else errno_name(errno)
        self.events.labels(name, str(reason)).inc(count)
        if aggregated:
            self.aggregated_events.inc(count)

    def dropped(self, kind: str, count: int = 1) -> None:
        self.dropped_events.labels(kind).inc(count)

    def overran(self, stage: str) -> None:
        self.overruns.labels(stage).inc()
