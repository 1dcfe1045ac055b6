"""Prometheus metrics of the node side (trace and agent).

Kernel counts are read from the BPF maps at scrape time, so they are exact even when
the ring buffer overflowed; user-space counters say what was delivered and diagnosed.
Everything lives in one registry object: nothing global. `serve` is the HTTP server of
/metrics and /healthz for trace, agent and handler alike.
"""

from __future__ import annotations

import errno as errno_mod
import gzip
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from execwatch.httpserver import BoundedServer, Request, ServerLimits, response
from execwatch.record import Reason


class KernelCounters(Protocol):
    def errno_totals(self) -> dict[int, int]: ...
    def death_totals(self) -> dict[str, int]: ...
    def stats(self) -> dict[str, int]: ...


# None when healthy, else a one-line reason: see pipeline.Heartbeat.problem.
HealthCheck = Callable[[], "str | None"]


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
) -> BoundedServer:
    """Serve `registry` on /metrics in a background thread; call .shutdown() to stop.

    With `health`, /healthz answers 200 or 503 with its reason (the liveness probe)."""
    answers, dropped = _Answers(registry, health), ServerMetrics(registry).dropped
    server = BoundedServer(address, answers, limits or ServerLimits(), dropped, name="metrics")
    server.start()
    return server


@dataclass(frozen=True)
class _Answers:
    registry: CollectorRegistry
    health: HealthCheck | None

    def __call__(self, request: Request) -> bytes:
        method, headers = request.method, request.headers
        if method not in ("GET", "HEAD"):
            return response("405 Method Not Allowed", "text/plain", b"GET or HEAD\n", method)
        if request.path == "/healthz" and self.health is not None:
            problem = self.health()
            status = "503 Service Unavailable" if problem else "200 OK"
            text = f"{problem or 'ok'}\n".encode()
            return response(status, "text/plain; charset=utf-8", text, method)
        encoder, content_type = choose_encoder(headers.get("accept", ""))
        body = encoder(self.registry)
        extra: tuple[tuple[str, str], ...] = ()
        if "gzip" in headers.get("accept-encoding", ""):
            body, extra = gzip.compress(body), (("Content-Encoding", "gzip"),)
        return response("200 OK", content_type, body, method, extra)


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
