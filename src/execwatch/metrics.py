"""Prometheus metrics of the node side (trace and agent).

Kernel counts are read from the BPF maps at scrape time, so they are exact even when
the ring buffer overflowed; user-space counters say what was delivered and diagnosed.
Everything lives in one registry object: nothing global.
"""

from __future__ import annotations

import errno as errno_mod
import socket
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, Counter, make_wsgi_app, start_http_server
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector

from execwatch.record import Reason


class KernelCounters(Protocol):
    def errno_totals(self) -> dict[int, int]: ...
    def death_totals(self) -> dict[str, int]: ...
    def stats(self) -> dict[str, int]: ...


# None when healthy, else a one-line reason: see pipeline.Heartbeat.problem.
HealthCheck = Callable[[], "str | None"]


def serve(
    address: tuple[str, int], registry: CollectorRegistry, health: HealthCheck | None = None
) -> Any:
    """Serve `registry` on /metrics in a background thread; call .shutdown() to stop.

    With `health`, /healthz answers 200 or 503 with its reason (the liveness probe)."""
    host, port = address
    if health is None:
        return start_http_server(port, host, registry=registry)[0]
    metrics_app = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != "/healthz":
            return metrics_app(environ, start_response)  # type: ignore[no-any-return]
        problem = health()
        status = "503 Service Unavailable" if problem else "200 OK"
        start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
        return [f"{problem or 'ok'}\n".encode()]

    server_class = _ServerV6 if ":" in host else ThreadingWSGIServer
    server = make_server(host, port, app, server_class, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server


class _ServerV6(ThreadingWSGIServer):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # scrapes are not news
        pass


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
