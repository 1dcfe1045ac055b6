"""`execwatch handler`: the leader-elected handler of ExecFailure records.

src/execwatch/cli.py owns the top-level parser; it calls `add_parser(subparsers)` here.
This is where the handler is assembled: placement's feedback is injected as its hook.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import uuid

from prometheus_client import CollectorRegistry

from execwatch import cliargs
from execwatch.cliargs import refused, stop_on_signals
from execwatch.handler.metrics import HandlerMetrics
from execwatch.serving.port import add_metrics_flags, metrics_server

log = logging.getLogger(__name__)


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `handler` on the top-level `execwatch` parser."""
    h = subparsers.add_parser("handler", help="turn records into Events, pod labels, metrics")
    cliargs.add_api_flags(h)
    add_metrics_flags(h)
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


def run_handler(args: argparse.Namespace) -> int:
    from execwatch.handler.controller import Handler, HandlerConfig
    from execwatch.kube.client import load_config
    from execwatch.placement.observed import feedback_hook

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
            ),
            load_config(args.kubeconfig),
            metrics,
            hook=feedback_hook(args.namespace) if args.placement_feedback else None,
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
