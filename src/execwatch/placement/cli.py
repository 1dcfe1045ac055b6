"""`execwatch placement`: one replica of placement, the webhook and the controller.

Every replica serves the webhook (POST /gate, POST /warn) with the certificate of the
mounted Secret, reloaded when it changes, and judges warn-mode pods. The replica holding
the Lease places gated pods, keeps the certificate Secret and the caBundle in step, and
expires unused ImageVerdicts; every replica reads and writes verdicts (scanned.py). On
SIGTERM it stops serving and releases the Lease; when its Deployment is gone or scaled to
zero, it then ungates every gated pod unchanged, so none is left behind. `--release` does
that for `helm uninstall` (a pre-delete hook, while the RBAC still exists): it deletes
the webhook configuration first, then ungates every gated pod.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import socket
import ssl
import threading
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from execwatch import cliargs
from execwatch.cliargs import refused
from execwatch.kube import errors
from execwatch.kube.client import load_config
from execwatch.scan.registry import add_arguments as registry_arguments
from execwatch.serving.port import add_metrics_flags, metrics_server

# The parts load when the command runs, not for `execwatch --help` (cryptography).
if TYPE_CHECKING:
    from execwatch.kube.client import Rest
    from execwatch.placement.run import PlacementController
    from execwatch.placement.serving import WebhookServer
    from execwatch.placement.verdicts import VerdictWriter
    from execwatch.placement.warnmode import WarnWorker
    from execwatch.serving.tls import CertFiles, CertRotator

log = logging.getLogger(__name__)

NAME = "execwatch-placement"  # the chart's fixed names: Lease, Service, Secret, ...
CERT_CHECK = 60.0  # seconds between the leader's checks of the Secret and the caBundle
TICK = 1.0  # seconds between looks at the mounted certificate files
REMOVED = "execwatch placement is being removed"


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `placement` on the top-level `execwatch` parser."""
    p = subparsers.add_parser(
        "placement", help="placement webhook + leader-elected controller (one replica)"
    )
    cliargs.add_api_flags(
        p,
        namespace_help="namespace of the Lease, the Secret and the Deployment (default:"
        " $POD_NAMESPACE or execwatch); its pods are never gated",
    )
    add_metrics_flags(p)
    p.add_argument(
        "--webhook-address",
        type=cliargs.address,
        default=":8443",
        metavar="HOST:PORT",
        help="the webhook's HTTPS port (POST /gate, POST /warn)",
    )
    p.add_argument(
        "--webhook-client-ca",
        type=cliargs.readable_file,
        metavar="FILE",
        help="PEM CA: the webhook accepts only callers presenting a client certificate it "
        "issued (the API server's, from its AdmissionConfiguration)",
    )
    p.add_argument(
        "--identity",
        default=f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}",
        help="this replica's Lease holder identity",
    )
    name = cliargs.dns_subdomain
    p.add_argument("--lease-name", type=name, default=NAME, help="in --namespace")
    lease_seconds = cliargs.Number(0, 3600)  # and retry < renew < lease: see LeaseConfig
    p.add_argument("--lease-duration", type=lease_seconds, default=15.0)
    p.add_argument("--renew-deadline", type=lease_seconds, default=10.0)
    p.add_argument("--retry-period", type=lease_seconds, default=2.0)
    p.add_argument("--workers", type=cliargs.Count(1, 64), default=16, help="pods judged at once")
    p.add_argument(
        "--budget",
        type=cliargs.Number(0, 600),
        default=30.0,
        help="seconds from a pod's creation to its decision, else it is ungated unchanged",
    )
    p.add_argument(
        "--strict",
        action="store_true",
        help="every failing binary of the image decides, not only what the pod starts",
    )
    p.add_argument(
        "--tls-dir",
        default="/etc/execwatch/placement-tls",
        help="the mounted certificate Secret (tls.crt, tls.key)",
    )
    p.add_argument("--secret", type=name, default=f"{NAME}-tls", help="the certificate Secret")
    p.add_argument(
        "--service",
        type=cliargs.dns_label,
        default=NAME,
        help="the webhook's Service: the certificate names its DNS names",
    )
    p.add_argument(
        "--webhook-configuration",
        type=name,
        default=NAME,
        help="the Mutating- and ValidatingWebhookConfiguration whose caBundle the leader sets",
    )
    p.add_argument(
        "--service-account",
        type=name,
        default=NAME,
        help="this replica's ServiceAccount, bound in each opted-in namespace to read its "
        "pull secrets",
    )
    p.add_argument(
        "--pull-credentials-role",
        type=name,
        default=f"{NAME}-pull-credentials",
        help="the ClusterRole (get secrets, serviceaccounts) bound, by a RoleBinding of the "
        "same name, in each opted-in namespace",
    )
    p.add_argument(
        "--deployment",
        type=name,
        default=NAME,
        help="this replica's Deployment: gone or scaled to 0 at SIGTERM, every gated pod "
        "is ungated before exit",
    )
    registry_arguments(p, credentials=False, private_networks=True)
    p.add_argument(
        "--release",
        action="store_true",
        help="do not serve: delete the webhook configuration, ungate every gated pod "
        "unchanged and exit (the chart's pre-delete hook)",
    )
    p.set_defaults(func=run)


@dataclass
class PlacementMetrics:
    """The controller's metrics: decisions, fail-opens, failed API calls."""

    registry: CollectorRegistry

    def __post_init__(self) -> None:
        self.seconds = Histogram(
            "execwatch_placement_decision_seconds",
            "Seconds from a pod's creation to its placement decision, by action.",
            ["action"],
            buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=self.registry,
        )
        self.fail_open = Counter(
            "execwatch_placement_fail_open",
            "Pods ungated unchanged for want of a verdict, by cause.",
            ["cause"],
            registry=self.registry,
        )
        self.api_errors = Counter(
            "execwatch_placement_api_errors",
            "Failed list and watch calls of the placement controller, by verb and code.",
            ["verb", "code"],
            registry=self.registry,
        )

    def decided(self, action: str, seconds: float) -> None:
        self.seconds.labels(action).observe(seconds)

    def failed_open(self, cause: str) -> None:
        self.fail_open.labels(_cause(cause)).inc()


def _cause(cause: str) -> str:
    """A bounded label value: the kind of cause, never a pod's or registry's words."""
    for kind in ("registry", "credentials", "pull secrets", "no verdict", "the API server"):
        if kind in cause:
            return kind
    return "other"


@dataclass
class Replica:
    """The parts of one replica, and the loop that keeps its certificate current."""

    args: argparse.Namespace
    rest: Rest
    controller: PlacementController
    worker: WarnWorker
    writer: VerdictWriter
    server: WebhookServer
    rotator: CertRotator
    files: CertFiles

    def health(self) -> str | None:
        return None if self.server.serving else "no webhook certificate yet"

    def maintain(self, stop: threading.Event) -> None:
        """Reload the served certificate when its files change; as leader, renew it and
        set the caBundle at once and then every CERT_CHECK seconds."""
        checked, leading = 0.0, False
        while not stop.wait(TICK):
            if self.files.changed():
                self._reload()
            now_leading = self.controller.elector.is_leader()
            if now_leading and (not leading or time.monotonic() - checked >= CERT_CHECK):
                checked = time.monotonic()
                self._sync()
            leading = now_leading

    def _reload(self) -> None:
        try:
            self.server.reload()
            log.info("webhook certificate loaded")
        except (OSError, ssl.SSLError) as exc:
            log.warning("webhook certificate not loaded", extra={"kv": {"error": str(exc)}})

    def _sync(self) -> None:
        try:
            self.rotator.sync()
        except errors.ApiError as err:
            log.warning("certificate not synced", extra={"kv": errors.as_dict(err)})

    def removed(self) -> bool:
        """True when this replica's Deployment is gone or scaled to zero: no replica will
        place what is gated."""
        from execwatch.kube.client import path

        where = path(
            "apis", "apps", "v1", "namespaces", self.args.namespace, "deployments",
            self.args.deployment,
        )  # fmt: skip
        try:
            deployment = self.rest.call("GET", where)
        except errors.NotFoundError:
            return True
        except errors.ApiError as err:
            log.warning("deployment not readable", extra={"kv": errors.as_dict(err)})
            return False
        meta, spec = deployment.get("metadata") or {}, deployment.get("spec") or {}
        return bool(meta.get("deletionTimestamp")) or spec.get("replicas") == 0


def build(args: argparse.Namespace, kube: Any, registry: CollectorRegistry) -> Replica:
    """Every part of a replica, nothing started. ValueError: a refusal to print."""
    from execwatch.kube.client import Rest
    from execwatch.kube.lease import LeaseConfig
    from execwatch.placement.access import NamespaceAccess
    from execwatch.placement.controller import Placer
    from execwatch.placement.expiry import VerdictExpiry
    from execwatch.placement.pullsecrets import PullSecrets
    from execwatch.placement.run import ControllerConfig, NodeArches, PlacementController
    from execwatch.placement.scanned import ScannedVerdicts
    from execwatch.placement.serving import WebhookServer
    from execwatch.placement.verdicts import VerdictMetrics, VerdictStore, VerdictWriter
    from execwatch.placement.warnmode import WarnWorker
    from execwatch.placement.webhook import http_handler
    from execwatch.runnable.limits import Limits
    from execwatch.scan.registry import options_from as registry_options
    from execwatch.scan.reuse import RegistryReuse, SessionPool
    from execwatch.serving.tls import CertFiles

    lease = LeaseConfig(
        namespace=args.namespace,
        name=args.lease_name,
        identity=args.identity,
        lease_duration=args.lease_duration,
        renew_deadline=args.renew_deadline,
        retry_period=args.retry_period,
        request_timeout=min(5.0, args.retry_period * 2),
    )
    rest = Rest(kube, pool=args.workers + 4)
    metrics = PlacementMetrics(registry)
    arches = NodeArches(rest)
    options = dataclasses.replace(
        registry_options(args), reuse=RegistryReuse(sessions=SessionPool(connections=args.workers))
    )
    writer = VerdictWriter(VerdictStore(rest, time.time), VerdictMetrics(registry))
    access = NamespaceAccess(rest, args.pull_credentials_role, args.namespace, args.service_account)
    source = ScannedVerdicts(
        PullSecrets(rest, access), options, Limits(), arches, args.strict, writer=writer
    )
    placer = Placer(rest, source, arches, metrics, budget=args.budget, own_namespace=args.namespace)
    expiry = VerdictExpiry(rest, registry=registry)
    controller = PlacementController(
        ControllerConfig(lease, workers=args.workers),
        placer,
        metrics.api_errors,
        leader_tasks=[expiry.run, access.run],
    )
    worker = WarnWorker(placer, args.namespace)
    files = CertFiles(os.path.join(args.tls_dir, "tls.crt"), os.path.join(args.tls_dir, "tls.key"))
    handler = http_handler(args.namespace, worker.submit)
    server = WebhookServer(
        args.webhook_address, handler, files.cert, files.key, registry,
        client_ca=_client_ca(args.webhook_client_ca),
    )  # fmt: skip
    rotator = _rotator(args, rest)
    return Replica(args, rest, controller, worker, writer, server, rotator, files)


def _client_ca(cafile: str | None) -> str | None:
    """`cafile` once it loads as a CA bundle. ValueError: a refusal to print."""
    if cafile is not None:
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_verify_locations(cafile=cafile)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"--webhook-client-ca {cafile}: no CA certificate: {exc}") from None
    return cafile


def _rotator(args: argparse.Namespace, rest: Rest) -> CertRotator:
    from execwatch.serving.certs import dns_names
    from execwatch.serving.tls import CertRotator

    names = dns_names(args.service, args.namespace)
    return CertRotator(rest, args.namespace, args.secret, args.webhook_configuration, names)


def run(args: argparse.Namespace) -> int:
    from execwatch.cliargs import stop_on_signals

    if args.release:
        return release(args)
    registry = CollectorRegistry()
    replica = _replica(args, registry)
    if isinstance(replica, int):
        return replica
    try:
        replica.server.start()
    except OSError as exc:
        replica.rest.close()
        return refused(f"--webhook-address: {exc.strerror or exc}")
    try:
        metrics = metrics_server(args, registry, replica.health)
    except ValueError as exc:
        replica.server.stop()
        replica.rest.close()
        return refused(str(exc))
    with stop_on_signals() as stop:
        replica.writer.start()
        replica.worker.start()
        replica.controller.start()
        log.info("placement started", extra={"kv": {"identity": args.identity}})
        replica.maintain(stop)
    _stop(replica)
    metrics.shutdown()
    return 0


def _stop(replica: Replica) -> None:
    """Stop gating first: a pod this replica gated is then in the list of the sweep."""
    replica.server.stop()
    replica.controller.stop()  # releases the Lease: the other replica takes over at once
    if replica.removed():
        _ungate_all(replica)
    replica.worker.stop()
    replica.writer.stop()
    replica.rest.close()


def _ungate_all(replica: Replica) -> bool:
    try:
        count = replica.controller.ungate_all(REMOVED)
    except errors.ApiError as err:
        log.warning("gated pods not listed", extra={"kv": errors.as_dict(err)})
        return False
    log.info("ungated every gated pod", extra={"kv": {"pods": count}})
    return True


def _replica(args: argparse.Namespace, registry: CollectorRegistry) -> Replica | int:
    """The replica, or the exit code of a refusal printed on one line."""
    try:
        replica = build(args, load_config(args.kubeconfig), registry)
    except ValueError as exc:  # LeaseConfig: retry < renew < lease
        return refused(str(exc))
    except Exception as exc:  # lightkube's ConfigError: no or a broken kubeconfig
        return refused(f"no API server credentials: {exc}")
    replica.files.changed()  # what start() loads now is not a change
    return replica


def release(args: argparse.Namespace) -> int:
    """`--release` (the chart's pre-delete hook): delete the webhook configuration, so
    that no pod is gated any more, then ungate every gated pod unchanged. Exit 1 when
    either failed (Helm then reports the hook as failed)."""
    from execwatch.serving.tls import CONFIGURATIONS, configuration_path

    replica = _replica(args, CollectorRegistry())
    if isinstance(replica, int):
        return replica
    for kind in CONFIGURATIONS:
        try:
            replica.rest.call("DELETE", configuration_path(kind, args.webhook_configuration))
        except errors.NotFoundError:
            pass
        except errors.ApiError as err:
            log.warning("webhook configuration not deleted", extra={"kv": errors.as_dict(err)})
            return 1
    done = _ungate_all(replica)
    replica.rest.close()
    return 0 if done else 1
