"""The metrics port: /metrics (Prometheus exposition), /healthz and /readyz, served by the
bounded HTTP server for trace, agent, handler and placement alike."""

from __future__ import annotations

import gzip
import ssl
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.exposition import choose_encoder

from execwatch.serving.http import BoundedServer, Deferred, Request, ServerLimits, response

# None when healthy, else a one-line reason: see pipeline.Heartbeat.problem.
HealthCheck = Callable[[], "str | None"]
# The answer to a scrape that `serve()` would give if allowed, else an error answer, or a
# Deferred one: cluster.metricsauth.MetricsAuth.answer.
Guard = Callable[[Request, Callable[[], bytes]], "bytes | Deferred"]
METRICS_PATH = "/metrics"  # the one path metrics are served on (and authorized for)


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
    limits: ServerLimits | None = None,
    guard: Guard | None = None,
    tls: ssl.SSLContext | None = None,
    readiness: HealthCheck | None = None,
) -> BoundedServer:
    """Serve `registry` on /metrics in a background thread; call .shutdown() to stop.

    /healthz answers 200, or with `health` 503 and its reason (the liveness probe);
    /readyz the same with `readiness` (the readiness probe: the agent is ready once its
    probe is loaded). Neither is guarded. Any other path is 404. With `guard`, /metrics
    passes it (authenticated metrics); with `tls`, the port speaks HTTPS."""
    answers = _Answers(registry, health, guard, readiness)
    dropped = ServerMetrics(registry).dropped
    limits = limits or ServerLimits()
    server = BoundedServer(address, answers, limits, dropped, tls, name="metrics")
    server.start()
    return server


def _check(check: HealthCheck | None, method: str) -> bytes:
    problem = check() if check is not None else None
    status = "503 Service Unavailable" if problem else "200 OK"
    return response(status, "text/plain; charset=utf-8", f"{problem or 'ok'}\n".encode(), method)


@dataclass(frozen=True)
class _Answers:
    registry: CollectorRegistry
    health: HealthCheck | None
    guard: Guard | None = None
    readiness: HealthCheck | None = None

    def __call__(self, request: Request) -> bytes | Deferred:
        method = request.method
        if method not in ("GET", "HEAD"):
            return response("405 Method Not Allowed", "text/plain", b"GET or HEAD\n", method)
        if request.path == "/healthz" and (self.health is not None or self.guard is not None):
            return _check(self.health, method)
        if request.path == "/readyz" and self.readiness is not None:
            return _check(self.readiness, method)
        if request.path != METRICS_PATH:
            return response("404 Not Found", "text/plain", b"not found\n", method)
        if self.guard is not None:
            return self.guard(request, lambda: self._metrics(request))
        return self._metrics(request)

    def _metrics(self, request: Request) -> bytes:
        method, headers = request.method, request.headers
        encoder, content_type = choose_encoder(headers.get("accept", ""))
        body = encoder(self.registry)
        extra: tuple[tuple[str, str], ...] = ()
        if "gzip" in headers.get("accept-encoding", ""):
            body, extra = gzip.compress(body), (("Content-Encoding", "gzip"),)
        return response("200 OK", content_type, body, method, extra)
