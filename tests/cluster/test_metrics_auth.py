"""Authenticated metrics (`--metrics-auth`) against a real API server.

The metrics server is the real `execwatch.node.metrics.serve` over TLS, guarded by
`serving.metricsauth.MetricsAuth`, whose reviews go through the agent's client (`kube.client.Rest`)
with the agent's own ServiceAccount token: the RBAC of deploy/base/optional/metrics-auth.yaml
is what lets it ask. Scrapers are real ServiceAccounts with real tokens.
"""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import http.client
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from kubernetes import client
from prometheus_client import CollectorRegistry, Counter

from execwatch.kube.client import Rest, config_for
from execwatch.serving.certs import issue
from execwatch.serving.exposition import serve
from execwatch.serving.http import BoundedServer
from execwatch.serving.metricsauth import AuthConfig, CertificateFiles, MetricsAuth, tls_context
from tests.support.kube.apiserver import KubeCluster, ensure_namespace
from tests.support.kube.apiserver_fixtures import AGENT_NODE, AGENT_SA, HANDLER_SA
from tests.support.kube.execwatch_process import ExecwatchProcess
from tests.support.kube.faultproxy import FaultProxy
from tests.support.wait import wait_until

METRICS_AUTH = (
    Path(__file__).resolve().parents[2] / "deploy" / "base" / "optional" / "metrics-auth.yaml"
)
SCRAPERS = "monitoring"
READER = {  # the chart's example ClusterRole for scrapers (metricsAuth.scrapers binds it)
    "apiVersion": "rbac.authorization.k8s.io/v1",
    "kind": "ClusterRole",
    "metadata": {"name": "execwatch-metrics-reader"},
    "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}],
}


@dataclass
class Scraper:
    port: int
    ca: Path

    def get(
        self, path: str = "/metrics", token: str | None = None, header: str | None = None
    ) -> tuple[int, str]:
        ctx = ssl.create_default_context(cafile=str(self.ca))
        conn = http.client.HTTPSConnection("localhost", self.port, context=ctx, timeout=20)
        headers = {"Authorization": header or f"Bearer {token}"} if header or token else {}
        with closing(conn):
            conn.request("GET", path, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.read().decode()


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def reviewing(served: Served) -> bool:
    """A TokenReview call has started."""
    return sample(served.registry, "execwatch_metrics_auth_reviews_total", type="token") > 0


@pytest.fixture(scope="module")
def rbac(kube: KubeCluster) -> Iterator[dict[str, str]]:
    """The optional metrics-auth RBAC applied (only it: the other optional file lets the
    agent list pods, which later tests of the shared API server must not inherit), tokens
    of a scraper bound to the reader role and of one that is not; removed afterwards."""
    kube.apply([d for d in yaml.safe_load_all(METRICS_AUTH.read_text()) if d])
    with kube.client() as api:
        ensure_namespace(api, SCRAPERS)
        core = client.CoreV1Api(api)
        for name in ("prometheus", "stranger", "latecomer"):
            core.create_namespaced_service_account(SCRAPERS, {"metadata": {"name": name}})
    kube.apply([READER])
    bind(kube, "prometheus")
    yield {
        name: kube.service_account_token(SCRAPERS, name)
        for name in ("prometheus", "stranger", "latecomer")
    }
    with kube.client() as api:
        rbac_api = client.RbacAuthorizationV1Api(api)
        rbac_api.delete_cluster_role_binding("execwatch-metrics-auth")
        rbac_api.delete_cluster_role("execwatch-metrics-auth")


def bind(kube: KubeCluster, name: str) -> None:
    kube.apply(
        [
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": f"execwatch-metrics-reader-{name}"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "execwatch-metrics-reader",
                },
                "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": SCRAPERS}],
            }
        ]
    )


@dataclass
class Served:
    scraper: Scraper
    registry: CollectorRegistry
    auth: MetricsAuth
    server: BoundedServer


@pytest.fixture
def certs(tmp_path: Path) -> tuple[str, str, Path]:
    bundle = issue(["localhost"], dt.datetime.now(dt.UTC))
    (tmp_path / "tls.crt").write_bytes(bundle.cert)
    (tmp_path / "tls.key").write_bytes(bundle.key)
    (tmp_path / "ca.crt").write_bytes(bundle.ca_cert)
    return str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"), tmp_path / "ca.crt"


@pytest.fixture
def start(certs: tuple[str, str, Path]) -> Iterator[Any]:
    """start(api, config) -> Served: a guarded metrics server whose reviews use `api`."""
    with ExitStack() as stack:

        def run(api: Any, config: AuthConfig | None = None) -> Served:
            registry = CollectorRegistry()
            Counter("execwatch_probe_check", "a sample", registry=registry).inc()
            auth = MetricsAuth(api, registry, config or AuthConfig(budget=2.0))
            stack.callback(auth.close)
            tls = tls_context(certs[0], certs[1], ["localhost"])
            server = serve(("127.0.0.1", 0), registry, None, guard=auth.answer, tls=tls)
            stack.callback(server.shutdown)
            return Served(Scraper(server.server_port, certs[2]), registry, auth, server)

        yield run


@pytest.fixture
def agent_token(kube: KubeCluster) -> str:
    return kube.node_token(*AGENT_SA, AGENT_NODE)


@pytest.fixture
def served(kube: KubeCluster, rbac: dict[str, str], agent_token: str, start: Any) -> Served:
    served: Served = start(kube.rest(agent_token))
    return served


def test_a_scraper_bound_to_the_reader_role_gets_the_metrics(
    served: Served, rbac: dict[str, str]
) -> None:
    status, body = served.scraper.get(token=rbac["prometheus"])
    assert status == 200
    assert "execwatch_probe_check_total 1.0" in body
    assert sample(served.registry, "execwatch_metrics_auth_requests_total", result="allowed") == 1


def test_a_service_account_without_the_role_is_forbidden(
    served: Served, rbac: dict[str, str]
) -> None:
    status, body = served.scraper.get(token=rbac["stranger"])
    assert (status, body) == (403, "forbidden\n")
    assert sample(served.registry, "execwatch_metrics_auth_requests_total", result="forbidden") == 1
    assert sample(served.registry, "execwatch_metrics_auth_requests_total", result="allowed") == 0


@pytest.mark.parametrize(
    "header",
    [None, "Bearer ", "Basic cHJvbWV0aGV1czpzZWNyZXQ=", "Bearer not-a-token", "Bearer eyJ.e30.x"],
)
def test_no_token_or_a_token_the_api_server_does_not_know_is_unauthenticated(
    served: Served, header: str | None
) -> None:
    status, body = served.scraper.get(header=header)
    assert (status, body) == (401, "unauthenticated\n")
    r = served.registry
    assert sample(r, "execwatch_metrics_auth_requests_total", result="unauthenticated") == 1


OTHER_PATHS = ["/version", "/api", "/livez", "/", "/metrics/extra", "/openapi/v2"]


def test_metrics_are_served_on_metrics_alone_and_healthz_is_open(
    served: Served, rbac: dict[str, str]
) -> None:
    """Every authenticated identity may `get` /version, /api, /livez (the built-in
    discovery roles): were the review made for the path asked, any token would read the
    metrics there. The stranger is bound to nothing."""
    assert served.scraper.get("/healthz") == (200, "ok\n")
    assert served.scraper.get(token=rbac["stranger"]) == (403, "forbidden\n")
    assert served.scraper.get(token=rbac["prometheus"])[0] == 200
    for token in (rbac["stranger"], rbac["prometheus"], None):
        for path in OTHER_PATHS:
            assert served.scraper.get(path, token=token) == (404, "not found\n"), (path, token)


def test_the_port_speaks_only_tls(served: Served) -> None:
    with closing(socket.create_connection(("127.0.0.1", served.scraper.port), timeout=5)) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        s.settimeout(10)
        try:
            answer = s.recv(4096)
        except ConnectionResetError:
            answer = b""
        assert answer == b""  # a failed handshake: closed, nothing served


def test_repeated_scrapes_make_one_review(
    kube: KubeCluster, rbac: dict[str, str], agent_token: str, start: Any
) -> None:
    """Five scrapes in a row and eight at once with one token: one TokenReview and one
    SubjectAccessReview reach the API server (counted by a proxy in front of it)."""
    pki = kube.workdir / "pki"
    proxy = FaultProxy(kube.port, pki / "serving.crt", pki / "serving.key", kube.ca, rate=0.0)
    proxy.start()
    try:
        served = start(Rest(config_for(proxy.url, str(kube.ca), agent_token)))
        for _ in range(5):
            assert served.scraper.get(token=rbac["prometheus"])[0] == 200
        assert proxy.requests == 2
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            results = list(
                pool.map(lambda _: served.scraper.get(token=rbac["stranger"])[0], range(8))
            )
        assert results == [403] * 8
        assert proxy.requests == 4
    finally:
        proxy.stop()
    r = served.registry
    assert sample(r, "execwatch_metrics_auth_reviews_total", type="token") == 2
    assert sample(r, "execwatch_metrics_auth_reviews_total", type="access") == 2
    assert sample(r, "execwatch_metrics_auth_requests_total", result="allowed") == 5
    assert sample(r, "execwatch_metrics_auth_requests_total", result="forbidden") == 8
    assert sample(r, "execwatch_metrics_auth_cache_hits_total") + 2 <= 13


def test_a_denial_expires_with_its_ttl_once_the_scraper_is_bound(
    kube: KubeCluster, rbac: dict[str, str], agent_token: str, start: Any
) -> None:
    served = start(kube.rest(agent_token), AuthConfig(budget=2.0, deny_ttl=0.5))
    assert served.scraper.get(token=rbac["latecomer"])[0] == 403
    bind(kube, "latecomer")
    wait_until(lambda: served.scraper.get(token=rbac["latecomer"])[0] == 200, timeout=15)


def test_an_api_server_that_never_answers_gives_503_within_the_budget(
    kube: KubeCluster, rbac: dict[str, str], agent_token: str, start: Any
) -> None:
    """A listener that never accepts: TCP connects, TLS never starts. Each scrape gets
    503 after the budget, counted once as a timeout; the server answers others meanwhile."""
    with closing(socket.create_server(("127.0.0.1", 0))) as silent:
        url = f"https://127.0.0.1:{silent.getsockname()[1]}"
        served = start(
            Rest(config_for(url, str(kube.ca), agent_token), timeout=1.0),
            AuthConfig(budget=1.0, max_inflight=2),
        )
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            began = time.monotonic()
            pending = pool.submit(served.scraper.get, token=rbac["prometheus"])
            wait_until(lambda: reviewing(served), timeout=5)
            assert served.scraper.get("/healthz") == (200, "ok\n")  # the loop is not held
            assert time.monotonic() - began < 1.0
            status, _ = pending.result(timeout=10)
            took = time.monotonic() - began
        assert status == 503
        assert 1.0 <= took < 2.5
        r = served.registry
        assert sample(r, "execwatch_metrics_auth_requests_total", result="timeout") == 1
        assert sample(r, "execwatch_metrics_auth_requests_total", result="allowed") == 0


def test_every_review_slot_taken_gives_503_at_once(
    kube: KubeCluster, rbac: dict[str, str], agent_token: str, start: Any
) -> None:
    with closing(socket.create_server(("127.0.0.1", 0))) as silent:
        url = f"https://127.0.0.1:{silent.getsockname()[1]}"
        served = start(
            Rest(config_for(url, str(kube.ca), agent_token), timeout=2.0),
            AuthConfig(budget=2.0, max_inflight=1),
        )
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pending = pool.submit(served.scraper.get, token=rbac["prometheus"])
            wait_until(lambda: reviewing(served), timeout=5)
            began = time.monotonic()
            assert served.scraper.get(token=rbac["stranger"])[0] == 503
            assert time.monotonic() - began < 0.5
            assert pending.result(timeout=10)[0] == 503
    r = served.registry
    assert sample(r, "execwatch_metrics_auth_requests_total", result="busy") == 1
    assert sample(r, "execwatch_metrics_auth_requests_total", result="timeout") == 1


def test_a_stopped_api_server_gives_503_counted_as_an_error(
    kube: KubeCluster, rbac: dict[str, str], agent_token: str, start: Any
) -> None:
    """The API server's address refuses connections (stopped): 503 at once, not cached."""
    pki = kube.workdir / "pki"
    proxy = FaultProxy(kube.port, pki / "serving.crt", pki / "serving.key", kube.ca, rate=0.0)
    proxy.start()
    served = start(Rest(config_for(proxy.url, str(kube.ca), agent_token)))
    assert served.scraper.get(token=rbac["prometheus"])[0] == 200
    proxy.stop()
    began = time.monotonic()
    assert [served.scraper.get(token=rbac["stranger"])[0] for _ in range(3)] == [503] * 3
    assert time.monotonic() - began < 3 * 2.0
    r = served.registry
    assert sample(r, "execwatch_metrics_auth_requests_total", result="error") == 3
    assert sample(r, "execwatch_metrics_auth_requests_total", result="allowed") == 1


def test_without_certificate_files_a_self_signed_one_is_served() -> None:
    tls = tls_context(None, None, ["execwatch-agent.execwatch.svc"])
    server = serve(("127.0.0.1", 0), CollectorRegistry(), tls=tls)
    try:
        insecure = ssl.create_default_context()
        insecure.check_hostname, insecure.verify_mode = False, ssl.CERT_NONE
        with (
            socket.create_connection(("127.0.0.1", server.server_port), timeout=5) as raw,
            insecure.wrap_socket(raw) as conn,
        ):
            der = conn.getpeercert(binary_form=True)
            assert conn.version() in ("TLSv1.2", "TLSv1.3")
    finally:
        server.shutdown()
    assert der is not None
    san = x509.load_der_x509_certificate(der).extensions.get_extension_for_class(
        x509.SubjectAlternativeName
    )
    assert san.value.get_values_for_type(x509.DNSName) == ["execwatch-agent.execwatch.svc"]


def test_the_handler_command_serves_authenticated_metrics(
    kube: KubeCluster, rbac: dict[str, str], tmp_path: Path
) -> None:
    """`execwatch handler --metrics-auth`, with the handler's own ServiceAccount: the flag
    turns the port to HTTPS (self-signed) and every scrape needs an allowed token."""
    config = kube.kubeconfig(kube.service_account_token(*HANDLER_SA), tmp_path / "kubeconfig")
    handler = ExecwatchProcess(
        ["handler", "--kubeconfig", str(config), "--metrics-auth", "--namespace", "execwatch"],
        tmp_path / "handler.log",
    )
    try:
        insecure = ssl.create_default_context()
        insecure.check_hostname, insecure.verify_mode = False, ssl.CERT_NONE

        def get(path: str, token: str | None = None) -> tuple[int, str]:
            conn = http.client.HTTPSConnection(
                "127.0.0.1", handler.port, context=insecure, timeout=10
            )
            with closing(conn):
                conn.request(
                    "GET", path, headers={"Authorization": f"Bearer {token}"} if token else {}
                )
                resp = conn.getresponse()
                return resp.status, resp.read().decode()

        def up() -> bool:
            try:
                return get("/healthz")[0] == 200
            except OSError:
                assert handler.proc.poll() is None, handler.log.read_text()
                return False

        wait_until(up, timeout=30)
        assert get("/metrics")[0] == 401
        assert get("/metrics", rbac["stranger"])[0] == 403
        status, body = get("/metrics", rbac["prometheus"])
        assert status == 200 and "execwatch_handler_leader" in body
        assert 'execwatch_metrics_auth_requests_total{result="forbidden"} 1.0' in body
    finally:
        handler.stop()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--metrics-tls-cert", "/nonexistent.crt"], "go together"),
        (
            ["--metrics-tls-cert", "/nonexistent.crt", "--metrics-tls-key", "/x.key"],
            "--metrics-tls-cert",
        ),
    ],
)
def test_bad_metrics_tls_flags_exit_2_with_one_line(
    flags: list[str], message: str, tmp_path: Path
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "execwatch.cli", "agent", "--kubeconfig", "/nonexistent", *flags],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and message in done.stderr, done.stderr


def test_a_rotated_certificate_is_served_to_new_connections(tmp_path: Path) -> None:
    """The kubelet swaps a mounted Secret's files; the next handshakes get the new pair."""

    def write(names: list[str], files: tuple[str, ...] = ("tls.crt", "tls.key")) -> None:
        bundle = issue(names, dt.datetime.now(dt.UTC))
        for name, data in (("tls.crt", bundle.cert), ("tls.key", bundle.key)):
            if name in files:
                (tmp_path / f"{name}.new").write_bytes(data)
                (tmp_path / f"{name}.new").replace(tmp_path / name)

    def served_names(port: int) -> list[str]:
        insecure = ssl.create_default_context()
        insecure.check_hostname, insecure.verify_mode = False, ssl.CERT_NONE
        with (
            socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
            insecure.wrap_socket(raw) as conn,
        ):
            der = conn.getpeercert(binary_form=True)
        assert der is not None
        san = x509.load_der_x509_certificate(der).extensions.get_extension_for_class(
            x509.SubjectAlternativeName
        )
        return san.value.get_values_for_type(x509.DNSName)

    write(["before"])
    cert, key = str(tmp_path / "tls.crt"), str(tmp_path / "tls.key")
    tls = tls_context(cert, key, [])
    files = CertificateFiles(tls, cert, key, every=0.1)
    files.start()
    server = serve(("127.0.0.1", 0), CollectorRegistry(), tls=tls)
    try:
        assert served_names(server.server_port) == ["before"]
        write(["half"], files=("tls.crt",))  # a new certificate with the old key
        time.sleep(0.3)
        assert served_names(server.server_port) == ["before"]  # a broken pair is not taken
        (tmp_path / "tls.key").write_bytes(b"not a key")
        time.sleep(0.3)
        assert served_names(server.server_port) == ["before"]
        write(["after"])
        wait_until(lambda: served_names(server.server_port) == ["after"], timeout=5)
    finally:
        server.shutdown()
