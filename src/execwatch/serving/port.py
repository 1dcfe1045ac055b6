"""The metrics port of the long-running commands (agent, handler, placement): its flags,
and the server they ask for: plain HTTP, TLS, or TLS with scrapes authenticated by the API
server (`metricsauth`)."""

from __future__ import annotations

import argparse
import socket
import ssl

from prometheus_client import CollectorRegistry

from execwatch import cliargs
from execwatch.serving.exposition import HealthCheck, serve
from execwatch.serving.http import BoundedServer


def add_metrics_flags(p: argparse.ArgumentParser) -> None:
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
        from execwatch.serving.metricsauth import CertificateFiles, tls_context

        try:
            tls = tls_context(args.metrics_tls_cert, args.metrics_tls_key, [socket.getfqdn()])
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"--metrics-tls-cert: {exc.strerror or exc}") from None
        if args.metrics_tls_cert:
            CertificateFiles(tls, args.metrics_tls_cert, args.metrics_tls_key).start()
    if args.metrics_auth:
        from execwatch.kube.client import Rest, load_config
        from execwatch.serving.metricsauth import AuthConfig, MetricsAuth

        config = AuthConfig(audiences=tuple(args.metrics_auth_audience))
        try:
            api = Rest(load_config(args.kubeconfig), timeout=config.budget)
        except Exception as exc:  # lightkube's ConfigError, a missing kubeconfig
            raise ValueError(f"--metrics-auth: no API server credentials: {exc}") from None
        guard = MetricsAuth(api, registry, config).answer
    try:
        return serve(
            args.metrics_address, registry, health, guard=guard, tls=tls, readiness=readiness
        )
    except OSError as exc:
        raise ValueError(f"--metrics-address: {exc.strerror or exc}") from None
