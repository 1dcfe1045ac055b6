"""A real, throw-away Kubernetes control plane for tests: etcd + kube-apiserver.

Both binaries are built from source at pinned releases by dev/k8s-tools.sh (`make test`
runs it). There is no kubelet, scheduler or controller-manager: tests create Pods and set
their status through the status subresource themselves, which is exactly what the
execwatch handler sees in a real cluster.

Everything listens on 127.0.0.1 on ephemeral ports, lives in a temporary directory and is
stopped by `stop()`. Authentication is real: an admin static token for setup, and
ServiceAccount tokens minted with the TokenRequest API (signed by a key generated here)
so code under test runs with exactly the RBAC the shipped manifests give it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, dynamic
from kubernetes.client.exceptions import ApiException

from execwatch.kube.client import Rest

REPO = Path(__file__).resolve().parents[3]
MANIFESTS = REPO / "deploy" / "base"
ADMIN_TOKEN = "execwatch-test-admin-token"


class MissingBinaries(RuntimeError):
    pass


def binary_dir() -> Path:
    return Path(os.environ.get("EXECWATCH_K8S_BIN", REPO / ".cache" / "k8s-bin"))


def find_binaries() -> dict[str, Path]:
    """kube-apiserver and etcd, or an error that says how to get them."""
    d = binary_dir()
    found = {name: d / name for name in ("kube-apiserver", "etcd")}
    missing = [str(p) for p in found.values() if not os.access(p, os.X_OK)]
    if missing:
        raise MissingBinaries(
            f"missing {', '.join(missing)}: run dev/k8s-tools.sh (make test runs it via "
            "dev/setup.sh --test)"
        )
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_pki(d: Path, sans: str = "IP:127.0.0.1,DNS:localhost") -> None:
    """A CA, a serving cert for `sans` (127.0.0.1/localhost), and the ServiceAccount key."""
    d.mkdir(parents=True, exist_ok=True)
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=execwatch-test-ca",
        cwd=d,
    )
    _openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "serving.key",
        "-out",
        "serving.csr",
        "-subj",
        "/CN=kube-apiserver",
        cwd=d,
    )
    (d / "san.ext").write_text(f"subjectAltName={sans}\n")
    _openssl(
        "x509",
        "-req",
        "-in",
        "serving.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "serving.crt",
        "-days",
        "2",
        "-extfile",
        "san.ext",
        cwd=d,
    )
    _openssl(
        "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", "sa.key", cwd=d
    )
    _openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=d)


def client_cert(d: Path, name: str, subject: str) -> tuple[Path, Path]:
    """A client certificate signed by make_pki's CA: `subject` like /O=group/CN=user."""
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
        "-subj", subject, cwd=d,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", cwd=d,
    )  # fmt: skip
    return d / f"{name}.crt", d / f"{name}.key"


@dataclass
class Proc:
    name: str
    argv: list[str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> None:
        p = self.popen
        if p is None or p.poll() is not None:
            return
        p.send_signal(sig)
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)

    def tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


@dataclass
class KubeCluster:
    """etcd + kube-apiserver on loopback; `admin` is a system:masters ApiClient."""

    workdir: Path
    bins: dict[str, Path] = field(default_factory=find_binaries)
    etcd: Proc | None = None
    apiserver: Proc | None = None
    port: int = 0

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def ca(self) -> Path:
        return self.workdir / "pki" / "ca.crt"

    @property
    def webhook_client_ca(self) -> Path:
        """The CA of the client certificate this API server presents to every webhook
        (its AdmissionConfiguration): a webhook that requires one trusts this CA."""
        return self.workdir / "webhook-client" / "ca.crt"

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        make_pki(self.workdir / "pki")
        (self.workdir / "tokens.csv").write_text(
            f'{ADMIN_TOKEN},execwatch-test-admin,admin-uid,"system:masters"\n'
        )
        etcd_port, peer_port = free_port(), free_port()
        self.etcd = Proc(
            "etcd",
            [
                str(self.bins["etcd"]),
                "--name=test",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{etcd_port}",
                f"--advertise-client-urls=http://127.0.0.1:{etcd_port}",
                f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-cluster=test=http://127.0.0.1:{peer_port}",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
            self.workdir / "etcd.log",
        )
        self.etcd.start()
        self.port = free_port()
        pki = self.workdir / "pki"
        admission = self._admission_configuration()
        self.apiserver = Proc(
            "kube-apiserver",
            [
                str(self.bins["kube-apiserver"]),
                f"--etcd-servers=http://127.0.0.1:{etcd_port}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.port}",
                f"--cert-dir={self.workdir / 'certs'}",
                f"--tls-cert-file={pki / 'serving.crt'}",
                f"--tls-private-key-file={pki / 'serving.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                f"--token-auth-file={self.workdir / 'tokens.csv'}",
                "--authorization-mode=RBAC",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--service-account-issuer=https://kubernetes.default.svc",
                "--api-audiences=https://kubernetes.default.svc",
                "--service-cluster-ip-range=10.96.0.0/24",
                # No controller-manager creates "default" ServiceAccounts in new namespaces.
                "--disable-admission-plugins=ServiceAccount",
                f"--admission-control-config-file={admission}",
                # The "kubernetes" Service endpoint may not be a loopback address.
                "--endpoint-reconciler-type=none",
                "--profiling=false",
                "--v=1",
            ],
            self.workdir / "kube-apiserver.log",
        )
        self._start_apiserver()

    def _admission_configuration(self) -> Path:
        """An AdmissionConfiguration giving the webhook plugins a client certificate for
        every webhook (kubeconfig user `*`), of a CA of its own: what a cluster that calls
        its webhooks over mutual TLS configures."""
        d = self.workdir / "webhook-client"
        make_pki(d)
        cert, key = client_cert(d, "apiserver", "/CN=kube-apiserver-webhook-client")
        users = {"users": [{"name": "*", "user": {"client-certificate": str(cert),
                                                   "client-key": str(key)}}]}  # fmt: skip
        kubeconfig = d / "kubeconfig.yaml"
        kubeconfig.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Config", **users}))
        plugins = [
            {"name": plugin, "configuration": {
                "apiVersion": "apiserver.config.k8s.io/v1",
                "kind": "WebhookAdmissionConfiguration",
                "kubeConfigFile": str(kubeconfig)}}
            for plugin in ("MutatingAdmissionWebhook", "ValidatingAdmissionWebhook")
        ]  # fmt: skip
        config = d / "admission.yaml"
        config.write_text(yaml.safe_dump({"apiVersion": "apiserver.config.k8s.io/v1",
                                          "kind": "AdmissionConfiguration",
                                          "plugins": plugins}))  # fmt: skip
        return config

    def _start_apiserver(self, timeout: float = 90.0) -> None:
        assert self.apiserver is not None
        self.apiserver.start()
        self.wait_ready(timeout)

    def wait_ready(self, timeout: float = 90.0) -> None:
        assert self.apiserver is not None and self.etcd is not None
        deadline = time.monotonic() + timeout
        ctx = ssl.create_default_context(cafile=str(self.ca))
        req = urllib.request.Request(
            self.url + "/readyz", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
        )
        while time.monotonic() < deadline:
            if not self.apiserver.alive() or not self.etcd.alive():
                raise RuntimeError(
                    "control plane died:\n" + self.apiserver.tail() + "\n" + self.etcd.tail()
                )
            # Readiness is probed with plain HTTPS: this is test plumbing, not the product.
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(req, context=ctx, timeout=2) as resp,
            ):
                if resp.status == 200:
                    return
            time.sleep(0.25)
        raise TimeoutError("kube-apiserver not ready:\n" + self.apiserver.tail())

    def restart_apiserver(self, down_for: float = 0.0) -> None:
        """Stop the API server (SIGTERM) and start it again on the same port."""
        assert self.apiserver is not None
        self.apiserver.stop()
        time.sleep(down_for)
        self._start_apiserver()

    def stop(self) -> None:
        for proc in (self.apiserver, self.etcd):
            if proc is not None:
                proc.stop()

    # -- clients ---------------------------------------------------------------------

    def config(self, token: str) -> client.Configuration:
        cfg = client.Configuration()
        cfg.host = self.url
        cfg.ssl_ca_cert = str(self.ca)
        cfg.api_key = {"authorization": f"Bearer {token}"}
        return cfg

    def client(self, token: str = ADMIN_TOKEN) -> client.ApiClient:
        return client.ApiClient(self.config(token))

    def client_config(self, token: str, server: str | None = None) -> Any:
        """The configuration execwatch's client takes (`kube.client.config_for`) for `token`."""
        from execwatch.kube.client import config_for

        return config_for(server or self.url, str(self.ca), token)

    def rest(self, token: str, timeout: float = 10.0) -> Rest:
        """execwatch's own client (`kube.client.Rest`) as `token`: what the agent, handler
        and placement run."""
        return Rest(self.client_config(token), timeout=timeout)

    def service_account_token(self, namespace: str, name: str, seconds: int = 3600) -> str:
        """A real ServiceAccount token from the TokenRequest API."""
        with self.client() as api:
            req = client.AuthenticationV1TokenRequest(
                spec=client.V1TokenRequestSpec(
                    audiences=["https://kubernetes.default.svc"], expiration_seconds=seconds
                )
            )
            resp = client.CoreV1Api(api).create_namespaced_service_account_token(
                name, namespace, req
            )
            token: str = resp.status.token
            return token

    def node_token(self, namespace: str, name: str, node: str, seconds: int = 3600) -> str:
        """A token of ServiceAccount `name` bound to a pod of it on `node`, as the kubelet
        mounts into a DaemonSet pod: the API server then knows the caller's node
        (user info extra `authentication.kubernetes.io/node-name`). Creates the Node and
        the pod (named after the node) if they do not exist yet."""
        pod_name = f"{name}-{node}"[:63]
        with self.client() as api:
            core = client.CoreV1Api(api)
            with contextlib.suppress(ApiException):
                core.create_node({"metadata": {"name": node}})
            try:
                pod = core.read_namespaced_pod(pod_name, namespace)
            except ApiException:
                pod = core.create_namespaced_pod(
                    namespace,
                    {
                        "metadata": {"name": pod_name},
                        "spec": {
                            "nodeName": node,
                            "serviceAccountName": name,
                            "containers": [{"name": "agent", "image": "execwatch:test"}],
                        },
                    },
                )
            req = client.AuthenticationV1TokenRequest(
                spec=client.V1TokenRequestSpec(
                    audiences=["https://kubernetes.default.svc"],
                    expiration_seconds=seconds,
                    bound_object_ref=client.V1BoundObjectReference(
                        api_version="v1", kind="Pod", name=pod_name, uid=pod.metadata.uid
                    ),
                )
            )
            resp = core.create_namespaced_service_account_token(name, namespace, req)
            token: str = resp.status.token
            return token

    def kubeconfig(self, token: str, path: Path) -> Path:
        """A kubeconfig file for `token`, for processes started by tests."""
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "test",
                    "cluster": {"server": self.url, "certificate-authority": str(self.ca)},
                }
            ],
            "users": [{"name": "u", "user": {"token": token}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "u"}}],
            "current-context": "test",
        }
        path.write_text(yaml.safe_dump(doc))
        return path

    # -- manifests -------------------------------------------------------------------

    def apply(self, docs: list[dict[str, Any]]) -> None:
        """Server-side apply each document, then wait for CRDs to be established."""
        with self.client() as api:
            apply(api, docs)


def apply(api: client.ApiClient, docs: list[dict[str, Any]]) -> None:
    """Server-side apply each document, then wait for CRDs to be established."""
    dyn = dynamic.DynamicClient(api)
    for doc in docs:
        res = dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
        dyn.server_side_apply(
            res,
            body=doc,
            namespace=doc["metadata"].get("namespace"),
            field_manager="execwatch-tests",
            force_conflicts=True,
        )
    ext = client.ApiextensionsV1Api(api)
    for doc in docs:
        if doc["kind"] == "CustomResourceDefinition":
            _wait_established(ext, doc["metadata"]["name"])


def _wait_established(ext: Any, name: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        crd = ext.read_custom_resource_definition(name)
        for cond in crd.status.conditions or []:
            if cond.type == "Established" and cond.status == "True":
                return
        time.sleep(0.1)
    raise TimeoutError(f"CRD {name} not established")


def load_manifests(directory: Path = MANIFESTS) -> list[dict[str, Any]]:
    """All documents of deploy/base, namespaces and CRDs first."""
    order = {"Namespace": 0, "CustomResourceDefinition": 1}
    docs: list[dict[str, Any]] = []
    for path in sorted(directory.glob("*.yaml")):
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return sorted(docs, key=lambda d: order.get(d["kind"], 2))


@contextlib.contextmanager
def running_cluster(workdir: Path) -> Iterator[KubeCluster]:
    cluster = KubeCluster(workdir)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        if os.environ.get("EXECWATCH_KEEP_KUBE") != "1":
            shutil.rmtree(workdir, ignore_errors=True)


def ensure_namespace(api: client.ApiClient, name: str) -> None:
    with contextlib.suppress(ApiException):
        client.CoreV1Api(api).create_namespace(client.V1Namespace(metadata={"name": name}))
