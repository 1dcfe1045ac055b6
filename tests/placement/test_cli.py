"""`execwatch placement` as a process, as the chart runs it: with the chart's
ServiceAccount and RBAC, its certificate Secret, Deployment and webhook configuration
(pointed at loopback instead of the Service: no pod network here). The test plays the
kubelet's part: it copies the Secret into the replica's TLS directory when it changes,
as a mounted Secret is refreshed."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, dynamic
from kubernetes.client.exceptions import ApiException

from execwatch.placement.affinity import ARCH_LABEL
from execwatch.placement.cli import REMOVED
from execwatch.placement.webhook import GATE, GATED_LABEL, GATED_VALUE, PodRef, review
from tests.placement.cluster import create_pod, gates, namespace
from tests.placement.test_controller import events, required_terms, stored
from tests.placement.test_scanned import AMD64_ONLY, liar, pull_secret
from tests.support.deploy.chart import Doc, find, render
from tests.support.kube.apiserver import KubeCluster, free_port
from tests.support.kube.execwatch_process import ExecwatchProcess
from tests.support.placement.chart_placement import (
    CLUSTER_KINDS,
    NAME,
    NODES,
    NS,
    VERDICTS,
    WEBHOOKS,
    Kubelet,
    ca_bundle_set,
    hold_lease,
    loopback,
    own_env,
    placement_rights,
)
from tests.support.registry.registry_server import Registry
from tests.support.wait import wait_until


@pytest.fixture(scope="module")
def port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def chart(kube: KubeCluster, port: int) -> Iterator[dict[str, Doc]]:
    """The chart's placement objects in the API server (the webhooks' at `port`), and
    nodes of both architectures."""
    docs = render("placement.enabled=true")
    rights = placement_rights(docs)
    made = {f"{d['kind']}/{d['metadata']['name']}": d for d in rights}
    made["CustomResourceDefinition"] = find(docs, "CustomResourceDefinition", VERDICTS)
    made["Secret"] = find(docs, "Secret", f"{NAME}-tls")
    made["Deployment"] = find(docs, "Deployment", NAME)
    for kind in WEBHOOKS:
        made[kind] = loopback(find(docs, kind, NAME), port)
    kube.apply(list(made.values()))
    with kube.client() as api:
        core = client.CoreV1Api(api)
        for node, arch in NODES.items():
            core.create_node({"metadata": {"name": node, "labels": {ARCH_LABEL: arch}}})
        try:
            yield made
        finally:
            for node in NODES:
                core.delete_node(node)
            dyn = dynamic.DynamicClient(api)
            for doc in [*(made[k] for k in WEBHOOKS), *rights]:
                if doc["kind"] in (*CLUSTER_KINDS, *WEBHOOKS):
                    res = dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
                    with contextlib.suppress(ApiException):  # --release deletes webhooks
                        res.delete(name=doc["metadata"]["name"])


class Replica:
    """One `execwatch placement` process with the chart's ServiceAccount token."""

    def __init__(
        self, kube: KubeCluster, tmp: Path, port: int, registry: Registry, identity: str
    ) -> None:
        tmp.mkdir(parents=True, exist_ok=True)
        (tmp / "tls").mkdir(exist_ok=True)
        token = kube.service_account_token(NS, NAME)
        kubeconfig = kube.kubeconfig(token, tmp / "kubeconfig")
        args = [
            "placement", "--kubeconfig", str(kubeconfig), "--namespace", NS,
            "--webhook-address", f"127.0.0.1:{port}", "--tls-dir", str(tmp / "tls"),
            # the certificate's first DNS name is the Service's bare name
            "--service", "localhost", "--identity", identity,
            "--lease-duration", "3", "--renew-deadline", "2", "--retry-period", "0.5",
            "--registry-ca", str(registry.ca), "--cache-dir", str(tmp / "cache"),
            "--webhook-client-ca", str(kube.webhook_client_ca),
            "--registry-allow-private", "127.0.0.0/8",  # the test registry is on loopback
        ]  # fmt: skip
        self.process = ExecwatchProcess(args, tmp / "log", env=own_env(tmp))

    def healthy(self) -> bool:
        try:
            url = f"http://{self.process.address}/healthz"
            with urllib.request.urlopen(url, timeout=2) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    def log(self) -> str:
        return self.process.log.read_text(errors="replace")[-3000:]


@pytest.fixture
def kubelet(admin: client.ApiClient, tmp_path: Path) -> Iterator[Path]:
    directory = tmp_path / "replica" / "tls"
    directory.mkdir(parents=True)
    copier = Kubelet(admin, directory)
    yield directory
    copier.stop.set()
    copier.thread.join()


def test_a_gated_pod_is_placed_by_the_command_with_the_charts_rights(
    chart: dict[str, Doc],
    kube: KubeCluster,
    admin: client.ApiClient,
    registry: Registry,
    built: dict[str, Path],
    host_glibc: dict[str, bytes],
    kubelet: Path,
    port: int,
    tmp_path: Path,
) -> None:
    replica = Replica(kube, tmp_path / "replica", port, registry, "replica-a")
    try:
        wait_until(replica.healthy, timeout=60, explain=replica.log)
        wait_until(lambda: ca_bundle_set(admin), timeout=30, explain=replica.log)
        image = liar(registry, built, host_glibc, tmp_path / "liar")
        ns = namespace(admin, "enforce")
        pod = create_pod(admin, ns, imagePullSecrets=[{"name": pull_secret(admin, ns, registry)}],
                         containers=[{"name": "app", "image": image}])  # fmt: skip

        wait_until(lambda: gates(stored(admin, pod)) == [], timeout=60, explain=replica.log)
        verdict = wait_until(
            lambda: verdict_of(admin, image, platforms=2),
            timeout=30,
            explain=lambda: str(verdict_of(admin, image)),
        )
    finally:
        replica.process.stop()
    now = stored(admin, pod)
    assert required_terms(now) == AMD64_ONLY, replica.log()
    [(kind, reason, note)] = events(admin, now)
    assert (kind, reason) == ("Normal", "Placed")
    assert note.startswith("placed on amd64 only: arm64: container 'app'")
    assert replica.process.proc.returncode == 0, replica.log()
    assert (verdict["status"]["runs"], verdict["status"]["fails"]) == ("linux/amd64", "linux/arm64")


def verdict_of(admin: client.ApiClient, image: str, platforms: int = 1) -> dict[str, Any] | None:
    """The ImageVerdict the process wrote for `image` once it holds `platforms` platforms
    (each platform's scan is written on its own, off the placement path)."""
    found = client.CustomObjectsApi(admin).list_cluster_custom_object(
        "execwatch.io", "v1alpha1", "imageverdicts"
    )
    mine = [v for v in found["items"] if v["spec"]["image"] == image]
    done = [v for v in mine if len(v.get("status", {}).get("platforms") or []) >= platforms]
    return done[0] if done else None


def gated_pod(admin: client.ApiClient, ns: str, name: str) -> dict[str, Any]:
    """A pod as the webhook leaves it: gated and labelled."""
    return create_pod(
        admin, ns, metadata={"name": name, "labels": {GATED_LABEL: GATED_VALUE}},
        schedulingGates=[{"name": GATE}],
    )  # fmt: skip


def test_at_uninstall_a_replica_ungates_every_gated_pod_before_it_exits(
    chart: dict[str, Doc],
    kube: KubeCluster,
    admin: client.ApiClient,
    registry: Registry,
    port: int,
    tmp_path: Path,
) -> None:
    hold_lease(admin)
    ns = namespace(admin, None)
    pods = [gated_pod(admin, ns, f"left-{i}") for i in range(3)]
    apps = client.AppsV1Api(admin)
    try:
        rolling = Replica(kube, tmp_path / "rolling", port, registry, "rolling")
        wait_until(rolling.process.serving, timeout=30, explain=rolling.log)
        rolling.process.stop()
        assert all(gates(stored(admin, p)) == [GATE] for p in pods), "a rolling update"

        last = Replica(kube, tmp_path / "last", port, registry, "last")
        wait_until(last.process.serving, timeout=30, explain=last.log)
        apps.delete_namespaced_deployment(NAME, NS)
        last.process.stop()
    finally:
        client.CoordinationV1Api(admin).delete_namespaced_lease(NAME, NS)
        kube.apply([chart["Deployment"]])

    assert last.process.proc.returncode == 0, last.log()
    for pod in pods:
        now = stored(admin, pod)
        assert gates(now) == [] and GATED_LABEL not in (now["metadata"].get("labels") or {})
        assert "affinity" not in now["spec"] or not now["spec"]["affinity"]
        [(kind, reason, note)] = events(admin, now)
        assert (kind, reason) == ("Warning", "PlacementSkipped")
        assert note == f"placed without a verdict: {REMOVED}"


def test_release_stops_the_gating_then_ungates_every_gated_pod(
    chart: dict[str, Doc], kube: KubeCluster, admin: client.ApiClient, tmp_path: Path
) -> None:
    """What the chart's pre-delete hook runs, with the chart's rights."""
    ns = namespace(admin, None)
    pods = [gated_pod(admin, ns, f"left-{i}") for i in range(2)]
    token = kube.service_account_token(NS, f"{NAME}-release")  # the Job's own
    kubeconfig = kube.kubeconfig(token, tmp_path / "kubeconfig")
    admission = client.AdmissionregistrationV1Api(admin)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "execwatch.cli", "placement", "--release",
             "--kubeconfig", str(kubeconfig), "--namespace", NS],
            capture_output=True, text=True, timeout=60, env=own_env(tmp_path),
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        with pytest.raises(ApiException) as gone:
            admission.read_mutating_webhook_configuration(NAME)
        assert gone.value.status == 404
        with pytest.raises(ApiException) as gone:
            admission.read_validating_webhook_configuration(NAME)
        assert gone.value.status == 404
    finally:
        kube.apply([chart[kind] for kind in WEBHOOKS])
    for pod in pods:
        now = stored(admin, pod)
        assert gates(now) == []
        assert [r for _, r, _ in events(admin, now)] == ["PlacementSkipped"]


DENIED = [
    ("list secrets", lambda a: client.CoreV1Api(a).list_namespaced_secret(NS)),
    ("create a secret", lambda a: client.CoreV1Api(a).create_namespaced_secret(
        NS, {"metadata": {"name": "execwatch-other"}})),
    ("delete a pod", lambda a: client.CoreV1Api(a).delete_namespaced_pod("p", NS)),
    ("replace a pod", lambda a: client.CoreV1Api(a).replace_namespaced_pod("p", NS, {})),
    ("update another secret", lambda a: client.CoreV1Api(a).replace_namespaced_secret(
        "execwatch-other", NS, {"metadata": {"name": "execwatch-other"}})),
    ("patch another webhook configuration",
     lambda a: client.AdmissionregistrationV1Api(a).patch_mutating_webhook_configuration(
         "other", [{"op": "test", "path": "/metadata/name", "value": "other"}])),
    ("read another deployment",
     lambda a: client.AppsV1Api(a).read_namespaced_deployment("execwatch-handler", NS)),
    ("update another lease", lambda a: client.CoordinationV1Api(a).replace_namespaced_lease(
        "execwatch-handler", NS, {"metadata": {"name": "execwatch-handler"}})),
    ("delete a node", lambda a: client.CoreV1Api(a).delete_node("placement-amd64")),
    ("write an ExecFailure", lambda a: client.CustomObjectsApi(a).create_namespaced_custom_object(
        "execwatch.io", "v1alpha1", NS, "execfailures", {})),
]  # fmt: skip


@pytest.mark.parametrize(("what", "call"), DENIED, ids=[d[0] for d in DENIED])
def test_the_charts_rights_refuse_what_placement_never_does(
    chart: dict[str, Doc], kube: KubeCluster, what: str, call: Any
) -> None:
    token = kube.service_account_token(NS, NAME)
    with kube.client(token) as api, pytest.raises(ApiException) as refused:
        call(api)
    assert refused.value.status == 403, (what, refused.value.body)


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--lease-duration", "0"], "--lease-duration: wants 0 < SECONDS"),
        (["--retry-period", "12"], "retry_period < renew_deadline < lease_duration"),
        (["--workers", "0"], "--workers: wants N in 1..64"),
        (["--tls-dir", "/nonexistent", "--webhook-address", "256.0.0.1:1"], "--webhook-address"),
        (["--webhook-client-ca", "/etc/passwd"], "--webhook-client-ca /etc/passwd: no CA"),
    ],
)
def test_a_bad_flag_is_one_line_and_exit_2(
    kube: KubeCluster, tmp_path: Path, flags: list[str], says: str
) -> None:
    kubeconfig = kube.kubeconfig("no-token-needed", tmp_path / "kubeconfig")
    argv = [sys.executable, "-m", "execwatch.cli", "placement", "--kubeconfig", str(kubeconfig)]
    done = subprocess.run(
        [*argv, "--metrics-address", "127.0.0.1:0", *flags],
        capture_output=True, text=True, timeout=60, env=own_env(tmp_path),
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert says in done.stderr


def test_a_dry_run_in_warn_mode_gets_the_warning_and_no_event() -> None:
    """The chart declares the warn webhook `sideEffects: NoneOnDryRun`: a dry run (e.g.
    `kubectl apply --dry-run=server`) must not post the Event."""
    handed: list[PodRef] = []
    pod = {"metadata": {"name": "p", "uid": "pod-uid"},
           "spec": {"containers": [{"name": "a", "image": "x"}]}}  # fmt: skip
    for dry in (True, False):
        request = {"uid": "u", "operation": "CREATE", "kind": {"kind": "Pod"},
                   "namespace": "team", "object": pod, "dryRun": dry}  # fmt: skip
        body = json.dumps({"request": request}).encode()
        answer = json.loads(review(body, NS, handed.append))
        assert answer["response"]["warnings"] and "patch" not in answer["response"]
    assert handed == [PodRef("team", "p", "pod-uid")], "only the real create is handed on"
