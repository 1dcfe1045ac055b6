"""`execwatch agent` and `execwatch handler`.

src/execwatch/cli.py owns the top-level parser; it calls `add_parser(subparsers)` here.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import ssl
import sys
import threading
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry

from execwatch import cliargs
from execwatch.cluster import crd
from execwatch.cluster.metrics import HandlerMetrics, PublisherMetrics
from execwatch.cluster.publisher import Publisher, PublisherConfig
from execwatch.metrics import HealthCheck, serve
from execwatch.text import one_line

if TYPE_CHECKING:
    from execwatch.httpserver import BoundedServer
    from execwatch.pipeline import Heartbeat

log = logging.getLogger(__name__)


def api_config(kubeconfig: str | None) -> Any:
    """lightkube's KubeConfig: the given kubeconfig, else in-cluster, else $KUBECONFIG or
    ~/.kube/config. In-cluster credentials are the pod's projected ServiceAccount token,
    re-read as the kubelet rotates it."""
    from execwatch.cluster import rest

    return rest.load_config(kubeconfig)


NAMESPACE_HELP = "namespace of the ExecFailure records (default: $POD_NAMESPACE or execwatch)"


def common_flags(p: argparse.ArgumentParser, namespace_help: str = NAMESPACE_HELP) -> None:
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then ~/.kube)")
    p.add_argument(
        "--namespace",
        type=cliargs.dns_label,
        default=os.environ.get("POD_NAMESPACE", crd.DEFAULT_NAMESPACE),
        help=namespace_help,
    )
    p.add_argument(
        "--metrics-address",
        type=cliargs.address,
        default=":9090",
        metavar="HOST:PORT",
        help="Prometheus endpoint",
    )
    p.add_argument(
        "--metrics-auth",
        action="store_true",
        help="serve /metrics over TLS only to a bearer token that the API server knows "
        "(TokenReview) and lets `get` the path (SubjectAccessReview); /healthz stays open",
    )
    p.add_argument(
        "--metrics-auth-audience",
        action="append",
        default=[],
        metavar="AUDIENCE",
        help="with --metrics-auth: accept only tokens for this audience (repeatable)",
    )
    p.add_argument("--metrics-tls-cert", metavar="FILE", help="PEM certificate of the metrics port")
    p.add_argument(
        "--metrics-tls-key",
        metavar="FILE",
        help="its key; without both, --metrics-auth serves a self-signed certificate",
    )


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `agent` and `handler` on the top-level `execwatch` parser."""
    a = subparsers.add_parser("agent", help="node agent: probe + attribution + publisher (root)")
    common_flags(a)
    a.add_argument(
        "--node",
        type=cliargs.dns_subdomain,
        default=os.environ.get("NODE_NAME") or socket.gethostname().lower(),
        help="this node's name (default: $NODE_NAME, or the hostname in lower case as the"
        " kubelet names its node)",
    )
    a.add_argument(
        "--aggregation-window",
        type=cliargs.Number(0, 86400, zero=True),
        default=60.0,
        help="repeats of one failure (container, path, reason, errno) within this long are"
        " one record with their count (the node has folded them per second before); the"
        " first window of a key",
    )
    a.add_argument(
        "--aggregation-window-max",
        type=cliargs.Number(0, 86400, zero=True),
        default=300.0,
        help="a key's window doubles each time it closes with repeats in it, up to this"
        " (300: the kubelet's longest CrashLoopBackOff); a key quiet for its window starts"
        " afresh; at or below --aggregation-window the window stays fixed",
    )
    a.add_argument(
        "--rate",
        type=cliargs.Number(0, 10000, unit="PER_SECOND"),
        default=20.0,
        help="record creates per second",
    )
    a.add_argument(
        "--burst", type=cliargs.Count(1, 100000), default=50, help="token bucket size for creates"
    )
    a.add_argument(
        "--spool-size",
        type=cliargs.Count(1, 1000000),
        default=2000,
        help="records kept while the API server is unreachable",
    )
    a.add_argument(
        "--spool-bytes",
        type=cliargs.Count(64 << 10, 4 << 30),
        default=32 << 20,
        help="bytes of records kept (their JSON), on disk and in memory",
    )
    a.add_argument(
        "--spool-dir",
        default="/var/lib/execwatch",
        help="directory of the on-disk spool, replayed on start (a hostPath in the "
        "DaemonSet); '' keeps the spool in memory only",
    )
    a.add_argument(
        "--spool-owner",
        default=os.environ.get("POD_NAME") or socket.gethostname(),
        help="name of this agent's spool file (default: $POD_NAME): a restarted "
        "container reopens its own; files of agents that are gone are adopted",
    )
    a.add_argument(
        "--pod-metadata",
        choices=["runtime", "api"],
        default="runtime",
        help="names from the container runtime only, or also a node-scoped pod "
        "watch (needs deploy/base/optional/agent-pod-reader.yaml)",
    )
    a.add_argument(
        "--host-root",
        type=Path,
        default=Path("/"),
        help="the node's root directory, where its binfmt_misc table and emulators are looked"
        " up (in a container with the host's PID namespace: /proc/1/root)",
    )
    a.add_argument("--window", action=cliargs.Renamed, successor="--aggregation-window")
    a.set_defaults(func=run_agent)

    h = subparsers.add_parser("handler", help="turn records into Events, pod labels, metrics")
    common_flags(h)
    h.add_argument(
        "--identity",
        default=f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}",
        help="this replica's Lease holder identity",
    )
    h.add_argument("--lease-name", type=cliargs.dns_subdomain, default="execwatch-handler")
    lease_seconds = cliargs.Number(0, 3600)  # and retry < renew < lease: see LeaseConfig
    h.add_argument("--lease-duration", type=lease_seconds, default=15.0)
    h.add_argument("--renew-deadline", type=lease_seconds, default=10.0)
    h.add_argument("--retry-period", type=lease_seconds, default=2.0)
    h.add_argument(
        "--max-series",
        type=cliargs.Count(1, 1000000),
        default=5000,
        help="cap on execwatch_exec_failures_total series (cardinality guard)",
    )
    h.add_argument(
        "--pod-label-metric",
        action="store_true",
        help="add a pod label to execwatch_exec_failures_total",
    )
    h.add_argument(
        "--no-label-pods",
        action="store_true",
        help="do not set the execwatch.io/exec-failure pod label",
    )
    h.add_argument(
        "--workers", type=cliargs.Count(1, 256), default=16, help="records handled in parallel"
    )
    h.add_argument(
        "--placement-feedback",
        action="store_true",
        help="write platform-class failures as observed ImageVerdicts and evict pods that "
        "keep failing in execwatch.io/placement=mitigate namespaces (docs/placement.md)",
    )
    h.set_defaults(func=run_handler)


def refused(message: str) -> int:
    """A start-up refusal: one line on stderr, exit 2."""
    print(f"execwatch: {one_line(message)}", file=sys.stderr)
    return 2


def metrics_server(
    args: argparse.Namespace,
    registry: CollectorRegistry,
    health: HealthCheck | None = None,
    readiness: HealthCheck | None = None,
) -> BoundedServer:
    """The metrics port: plain, TLS, or TLS with authenticated scrapes. ValueError: a
    refusal to print."""
    if bool(args.metrics_tls_cert) != bool(args.metrics_tls_key):
        raise ValueError("--metrics-tls-cert and --metrics-tls-key go together")
    guard, tls = None, None
    if args.metrics_auth or args.metrics_tls_cert:
        from execwatch.cluster.metricsauth import CertificateFiles, tls_context

        try:
            tls = tls_context(args.metrics_tls_cert, args.metrics_tls_key, [socket.getfqdn()])
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"--metrics-tls-cert: {exc.strerror or exc}") from None
        if args.metrics_tls_cert:
            CertificateFiles(tls, args.metrics_tls_cert, args.metrics_tls_key).start()
    if args.metrics_auth:
        from execwatch.cluster import kubeapi
        from execwatch.cluster.metricsauth import AuthConfig, MetricsAuth

        config = AuthConfig(audiences=tuple(args.metrics_auth_audience))
        try:
            api = kubeapi.client(args.kubeconfig, timeout=config.budget)
        except Exception as exc:  # lightkube's ConfigError, a missing kubeconfig
            raise ValueError(f"--metrics-auth: no API server credentials: {exc}") from None
        guard = MetricsAuth(api, registry, config).answer
    try:
        return serve(
            args.metrics_address, registry, health, guard=guard, tls=tls, readiness=readiness
        )
    except OSError as exc:
        raise ValueError(f"--metrics-address: {exc.strerror or exc}") from None


def run_handler(args: argparse.Namespace) -> int:
    from execwatch.cluster.handler import Handler, HandlerConfig  # not loaded by the agent
    from execwatch.trace import stop_on_signals

    registry = CollectorRegistry()
    metrics = HandlerMetrics(
        max_series=args.max_series, with_pod_label=args.pod_label_metric, registry=registry
    )
    try:
        handler = Handler(
            HandlerConfig(
                identity=args.identity,
                namespace=args.namespace,
                lease_name=args.lease_name,
                lease_duration=args.lease_duration,
                renew_deadline=args.renew_deadline,
                retry_period=args.retry_period,
                label_pods=not args.no_label_pods,
                workers=args.workers,
                placement_feedback=args.placement_feedback,
            ),
            api_config(args.kubeconfig),
            metrics,
        )
        server = metrics_server(args, registry)
    except ValueError as exc:  # LeaseConfig: retry < renew < lease; the metrics port
        return refused(str(exc))
    except Exception as exc:  # lightkube's ConfigError: no or a broken kubeconfig
        return refused(f"no API server credentials: {exc}")
    with stop_on_signals() as stop:
        handler.start()
        log.info("handler started", extra={"kv": {"identity": args.identity}})
        stop.wait()
    handler.stop()
    server.shutdown()
    return 0


def run_agent(args: argparse.Namespace) -> int:
    """Probe + attribution + publisher: what the DaemonSet runs on every node."""
    from execwatch.pipeline import Heartbeat

    registry = CollectorRegistry()
    heartbeat = Heartbeat()  # /healthz: the consume loop goes round
    tracing = threading.Event()  # /readyz: the probe is loaded and attached

    def readiness() -> str | None:
        return None if tracing.is_set() else "the probe is not loaded yet"

    try:
        server = metrics_server(args, registry, heartbeat.problem, readiness)
    except ValueError as exc:
        return refused(str(exc))
    try:
        return _agent(args, registry, heartbeat, tracing)
    finally:
        server.shutdown()


def _agent(
    args: argparse.Namespace,
    registry: CollectorRegistry,
    heartbeat: Heartbeat,
    tracing: threading.Event,
) -> int:
    from execwatch.attribution import Attributor
    from execwatch.cluster import agent, kubeapi
    from execwatch.cluster.spool import Spool, SpoolError
    from execwatch.probe import ProbeError
    from execwatch.trace import stop_on_signals

    try:
        api = kubeapi.client(args.kubeconfig)
        spool = Spool(Path(args.spool_dir), args.spool_owner) if args.spool_dir else None
    except SpoolError as exc:
        return refused(f"{exc} (--spool-dir '' keeps it in memory)")
    except Exception as exc:  # lightkube's ConfigError, a missing kubeconfig
        return refused(f"no API server credentials: {exc}")
    publisher = Publisher(
        PublisherConfig(
            node=args.node,
            namespace=args.namespace,
            aggregation_window=args.aggregation_window,
            aggregation_window_max=args.aggregation_window_max,
            rate=args.rate,
            burst=args.burst,
            spool_size=args.spool_size,
            spool_bytes=args.spool_bytes,
        ),
        kubeapi.RecordApi(api, args.namespace),
        PublisherMetrics(registry=registry),
        spool=spool,
    )
    pods = agent.pod_cache(args.node, api) if args.pod_metadata == "api" else None
    publisher.start()  # replays the spool before the probe starts
    handover = None
    try:
        with stop_on_signals() as stop, Attributor(pods=pods) as attributor:
            handover = agent.run(
                publisher,
                attributor,
                stop,
                registry=registry,
                ready=tracing,
                heartbeat=heartbeat,
                host_root=args.host_root,
            )
    except (ProbeError, OSError, ValueError) as exc:
        return refused(str(exc))
    finally:
        publisher.stop(handover_at=handover)
    return 0
