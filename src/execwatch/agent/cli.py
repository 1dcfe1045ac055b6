"""`execwatch agent`: what the DaemonSet runs on every node.

src/execwatch/cli.py owns the top-level parser; it calls `add_parser(subparsers)` here.
"""

from __future__ import annotations

import argparse
import os
import socket
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from execwatch import cliargs
from execwatch.agent.metrics import PublisherMetrics
from execwatch.agent.publisher import Publisher, PublisherConfig
from execwatch.cliargs import refused, stop_on_signals
from execwatch.serving.port import add_metrics_flags, metrics_server

if TYPE_CHECKING:
    from execwatch.pipeline import Heartbeat


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `agent` on the top-level `execwatch` parser."""
    a = subparsers.add_parser("agent", help="node agent: probe + attribution + publisher (root)")
    cliargs.add_api_flags(a)
    add_metrics_flags(a)
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
        " first window of a key, which doubles each time it closes with repeats in it, up to"
        " the kubelet's longest CrashLoopBackOff (300 s); 0: no aggregation",
    )
    a.add_argument(
        "--aggregation-window-max",
        action=cliargs.Renamed,
        successor="--aggregation-window alone: a repeating failure's window doubles up to"
        " the kubelet's longest back-off, 300 s",
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
    from execwatch.agent import daemon
    from execwatch.agent.records import RecordApi
    from execwatch.agent.spool import Spool, SpoolError
    from execwatch.attribution import Attributor
    from execwatch.kube.client import Rest, load_config
    from execwatch.probe import ProbeError

    try:
        api = Rest(load_config(args.kubeconfig), pool=4)
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
            rate=args.rate,
            burst=args.burst,
            spool_size=args.spool_size,
            spool_bytes=args.spool_bytes,
        ),
        RecordApi(api, args.namespace),
        PublisherMetrics(registry=registry),
        spool=spool,
    )
    pods = daemon.pod_cache(args.node, api, registry) if args.pod_metadata == "api" else None
    publisher.start()  # replays the spool before the probe starts
    handover = None
    try:
        with stop_on_signals() as stop, Attributor(pods=pods) as attributor:
            handover = daemon.run(
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
