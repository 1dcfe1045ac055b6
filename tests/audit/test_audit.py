"""`execwatch audit` against a real kube-apiserver whose workloads use images in a real
registry: a mix of ready and broken workloads, an amd64 node, and arm64 nodes to be added."""

from __future__ import annotations

import functools
import json
import socket
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from execwatch.audit.engine import ImageAuditor
from execwatch.audit.engine import audit as run_audit
from execwatch.audit.inventory import ClusterNode, Container, Inventory, Workload
from execwatch.cli import main
from execwatch.runnable.limits import Limits
from execwatch.runnable.verdict import Outcome
from execwatch.scan.isolated import MiB, ProcessLimits
from execwatch.scan.registry import RegistryOptions, resolve
from tests.audit.audit_cli import NS, AuditCli
from tests.support.images.imagebuild import Image, file, layer_tar, oci_layout
from tests.support.kube.apiserver import KubeCluster
from tests.support.registry.registry_server import HostileRegistry, Registry

ARM64_ONLY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {
                    "matchExpressions": [
                        {"key": "kubernetes.io/arch", "operator": "In", "values": ["arm64"]}
                    ]
                }
            ]
        }
    }
}
READ_ONLY = [
    {"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": ["list"]},
    {
        "apiGroups": ["apps"],
        "verbs": ["list"],
        "resources": ["deployments", "replicasets", "statefulsets", "daemonsets"],
    },
    {"apiGroups": ["batch"], "resources": ["jobs", "cronjobs"], "verbs": ["list"]},
]


def pod_spec(image: str, **extra: Any) -> dict[str, Any]:
    return {"containers": [{"name": "main", "image": image}], **extra}


def template(app: str, image: str, **extra: Any) -> dict[str, Any]:
    return {"metadata": {"labels": {"app": app}}, "spec": pod_spec(image, **extra)}


def sel(app: str) -> dict[str, Any]:
    return {"matchLabels": {"app": app}}


def owner(obj: Any, kind: str, api_version: str) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": api_version,
            "kind": kind,
            "name": obj.metadata.name,
            "uid": obj.metadata.uid,
            "controller": True,
        }
    ]


@pytest.fixture(scope="module")
def cluster(kube: KubeCluster, registry: Registry, pushed: dict[str, str]) -> dict[str, str]:
    """One amd64 node and workloads over the pushed images; returns the index digest of hello."""
    with kube.client() as api:
        core, apps, batch = client.CoreV1Api(api), client.AppsV1Api(api), client.BatchV1Api(api)
        core.create_namespace({"metadata": {"name": NS}})
        core.create_node(
            {
                "metadata": {
                    "name": "audit-amd64-1",
                    "labels": {"kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux"},
                }
            }
        )
        web = apps.create_namespaced_deployment(
            NS,
            {
                "metadata": {"name": "web"},
                "spec": {"selector": sel("web"), "template": template("web", pushed["hello"])},
            },
        )
        apps.create_namespaced_deployment(
            NS,
            {
                "metadata": {"name": "legacy"},
                "spec": {"selector": sel("legacy"), "template": template("legacy", pushed["musl"])},
            },
        )
        apps.create_namespaced_daemon_set(
            NS,
            {
                "metadata": {"name": "agent"},
                "spec": {
                    "selector": sel("agent"),
                    "template": template(
                        "agent", pushed["hello"], nodeSelector={"kubernetes.io/arch": "amd64"}
                    ),
                },
            },
        )
        apps.create_namespaced_stateful_set(
            NS,
            {
                "metadata": {"name": "db"},
                "spec": {
                    "serviceName": "db",
                    "selector": sel("db"),
                    "template": template("db", pushed["whiteout"], affinity=ARM64_ONLY),
                },
            },
        )
        batch.create_namespaced_cron_job(
            NS,
            {
                "metadata": {"name": "report"},
                "spec": {
                    "schedule": "0 3 * * *",
                    "jobTemplate": {
                        "spec": {
                            "template": template("report", pushed["multi"], restartPolicy="Never")
                        }
                    },
                },
            },
        )
        # A Deployment's pod, owned through its ReplicaSet, pinned by the digest it pulled.
        rs = apps.create_namespaced_replica_set(
            NS,
            {
                "metadata": {
                    "name": "web-5d9",
                    "ownerReferences": owner(web, "Deployment", "apps/v1"),
                },
                "spec": {"selector": sel("web"), "template": template("web", pushed["hello"])},
            },
        )
        pod = core.create_namespaced_pod(
            NS,
            {
                "metadata": {
                    "name": "web-5d9-x1",
                    "labels": {"app": "web"},
                    "ownerReferences": owner(rs, "ReplicaSet", "apps/v1"),
                },
                "spec": pod_spec(pushed["hello"]),
            },
        )
        _, _, digest = resolve(
            pushed["hello"],
            RegistryOptions(
                config_files=[str(registry.auth_file(Path(kube.workdir) / "auth.json"))],
                ca_file=str(registry.ca),
                cache_bytes=0,
            ),
            Limits(),
        )
        repo = pushed["hello"].rsplit(":", 1)[0]
        core.patch_namespaced_pod_status(
            pod.metadata.name,
            NS,
            {
                "status": {
                    "phase": "Running",
                    "containerStatuses": [
                        {
                            "name": "main",
                            "image": pushed["hello"],
                            "imageID": f"{repo}@{digest}",
                            "ready": True,
                            "restartCount": 0,
                        }
                    ],
                }
            },
        )
        core.create_namespaced_pod(
            NS, {"metadata": {"name": "debug"}, "spec": pod_spec(pushed["ready"])}
        )
    return {"hello": digest}


@pytest.fixture(scope="module")
def warm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache the tests that do not count scans share: each image is scanned once."""
    return tmp_path_factory.mktemp("audit-cache")


@pytest.fixture
def audit_warm(audit_cli: AuditCli, warm: Path) -> AuditCli:
    """audit_cli with the warm cache."""
    return functools.partial(audit_cli, "--cache-dir", str(warm))


def statuses(doc: dict[str, Any]) -> dict[str, dict[str, str]]:
    return {
        f"{w['kind']}/{w['name']}": {a: r["status"] for a, r in w["architectures"].items()}
        for w in doc["workloads"]
    }


def test_migration_readiness_of_a_mixed_cluster(
    cluster: dict[str, str],
    audit_warm: AuditCli,
) -> None:
    code, out, _ = audit_warm(
        "--arch",
        "arm64",
        "--format",
        "json",
    )
    doc = json.loads(out)
    assert code == 1
    assert doc["architectures"] == {"amd64": "1 node", "arm64": "planned"}
    assert statuses(doc) == {
        "CronJob/report": {"amd64": "missing-platform", "arm64": "ready"},
        "DaemonSet/agent": {"amd64": "ready"},
        "Deployment/legacy": {"amd64": "would-fail", "arm64": "missing-platform"},
        "Deployment/web": {"amd64": "ready", "arm64": "ready"},
        "Pod/debug": {"amd64": "missing-platform", "arm64": "ready"},
        "StatefulSet/db": {"arm64": "would-fail"},
    }
    by_key = {f"{w['kind']}/{w['name']}": w for w in doc["workloads"]}
    assert by_key["DaemonSet/agent"]["notScheduledOn"] == ["arm64"]
    (web,) = by_key["Deployment/web"]["architectures"]["arm64"]["containers"]
    assert web["reference"].endswith("@" + cluster["hello"])  # what the kubelet pulled
    (db,) = by_key["StatefulSet/db"]["architectures"]["arm64"]["containers"]
    assert {
        "check": "missing-interpreter",
        "path": "/usr/bin/hello",
        "entrypoint": True,
    }.items() <= db["findings"][0].items()
    (legacy,) = by_key["Deployment/legacy"]["architectures"]["amd64"]["containers"]
    assert [f["check"] for f in legacy["findings"]] == ["missing-interpreter"]


def test_a_re_audit_scans_only_what_changed(
    cluster: dict[str, str],
    tmp_path: Path,
    audit_cli: AuditCli,
) -> None:
    cache = tmp_path / "shared-cache"
    _, out, _ = audit_cli("--format", "json", cache=cache)
    first = json.loads(out)
    assert first["fromCache"] == 0 and first["scanned"] > 0
    _, out, _ = audit_cli("--format", "json", "--arch", "arm64", cache=cache)
    second = json.loads(out)
    assert second["fromCache"] >= first["scanned"]  # amd64 verdicts come from the cache
    assert second["scanned"] > 0  # arm64 ones are new
    _, out, _ = audit_cli("--format", "json", "--arch", "arm64", cache=cache)
    third = json.loads(out)
    assert third["scanned"] == 0 and statuses(third) == statuses(second)


def test_sarif_and_table(
    cluster: dict[str, str],
    tmp_path: Path,
    audit_warm: AuditCli,
) -> None:
    code, out, _ = audit_warm(
        "--arch",
        "arm64",
        "--format",
        "sarif",
    )
    rules = {r["ruleId"] for r in json.loads(out)["runs"][0]["results"]}
    assert code == 1 and rules == {"audit/would-fail", "audit/missing-platform"}
    table = tmp_path / "report.txt"
    code, out, _ = audit_warm(
        "--arch",
        "arm64",
        "-o",
        str(table),
    )
    text = table.read_text()
    assert code == 1 and out == ""
    assert "Migration readiness" in text and "main: /usr/bin/hello ★ missing-interpreter" in text
    assert (
        "6 workloads; per workload and architecture: 5 ready, 0 emulated, 3 missing-platform,"
        " 2 would-fail" in text
    )


def test_read_only_service_account_and_a_denied_one(
    cluster: dict[str, str],
    kube: KubeCluster,
    admin: client.ApiClient,
    audit_cli: AuditCli,
    audit_warm: AuditCli,
) -> None:
    core, rbac = client.CoreV1Api(admin), client.RbacAuthorizationV1Api(admin)
    for name in ("auditor", "nobody"):
        core.create_namespaced_service_account(NS, {"metadata": {"name": name}})
    rbac.create_cluster_role({"metadata": {"name": "execwatch-audit"}, "rules": READ_ONLY})
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": "execwatch-audit"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "execwatch-audit",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "auditor", "namespace": NS}],
        }
    )
    code, out, _ = audit_cli(
        "--format",
        "json",
        token=kube.service_account_token(NS, "auditor"),
    )
    assert code == 1 and len(json.loads(out)["workloads"]) == 6
    code, out, err = audit_warm(
        token=kube.service_account_token(NS, "nobody"),
    )
    assert (code, out) == (2, "")
    assert err.startswith("execwatch audit: error: cluster: Forbidden") and err.count("\n") == 1


def test_images_that_cannot_be_checked_are_errors_and_exit_2(
    cluster: dict[str, str],
    registry: Registry,
    admin: client.ApiClient,
    audit_cli: AuditCli,
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{s.getsockname()[1]}"
    core, apps = client.CoreV1Api(admin), client.AppsV1Api(admin)
    core.create_namespace({"metadata": {"name": "gone"}})
    images = {
        "down": f"{closed}/team/app:1",
        "absent": f"{registry.host}/team/absent:1",
        "typo": f"{registry.host}/Team/App:1",
    }
    for name, image in images.items():
        spec = {"selector": sel(name), "template": template(name, image)}
        apps.create_namespaced_deployment("gone", {"metadata": {"name": name}, "spec": spec})
    code, out, _ = audit_cli("-n", "gone", "--format", "json")
    assert code == 2
    messages = {
        w["name"]: w["architectures"]["amd64"]["containers"][0]["message"]
        for w in json.loads(out)["workloads"]
    }
    assert statuses(json.loads(out)) == {f"Deployment/{n}": {"amd64": "error"} for n in images}
    assert "connection refused by the registry" in messages["down"]
    assert "not found in the registry" in messages["absent"]
    assert "not a valid image reference" in messages["typo"]


@pytest.mark.parametrize(
    "kubeconfig", ["garbage: [\n", "- a list\n- not a kubeconfig\n", "clusters: 7\n"]
)
def test_a_broken_kubeconfig_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, kubeconfig: str
) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(kubeconfig)
    assert main(["audit", "--kubeconfig", str(path), "--no-progress"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("execwatch audit: error: cluster: ")
    assert err.count("\n") == 1


def deep_path(depth: int) -> str:
    return "/".join(["d"] * depth) + "/run"


def test_one_image_that_cannot_be_checked_is_its_workloads_error_not_an_aborted_audit(
    cluster: dict[str, str],
    registry: Registry,
    pushed: dict[str, str],
    tmp_path: Path,
    admin: client.ApiClient,
    audit_cli: AuditCli,
) -> None:
    """Issue 24: one layer with a member 1,200 directories deep aborted the whole audit with
    a RecursionError and no report. That image is checked now, one 3,000 deep is an error
    verdict with its one-line cause, and every other workload keeps its verdict."""
    work = tmp_path / "images"
    images = {
        "deep": Image([[file(deep_path(1200), b"#!/nowhere/sh\n")]]),
        "deeper": Image([[file(deep_path(3000), b"#!/nowhere/sh\n")]]),
    }
    refs = {n: registry.push(oci_layout(work / n, [i]), f"team/{n}:1") for n, i in images.items()}
    refs["web"] = pushed["hello"]
    core, apps = client.CoreV1Api(admin), client.AppsV1Api(admin)
    core.create_namespace({"metadata": {"name": "deep"}})
    for name, image in refs.items():
        spec = {"selector": sel(name), "template": template(name, image)}
        apps.create_namespaced_deployment("deep", {"metadata": {"name": name}, "spec": spec})
    code, out, err = audit_cli("-n", "deep", "--format", "json")
    assert (code, err) == (2, "")
    doc = json.loads(out)
    assert statuses(doc) == {
        "Deployment/deep": {"amd64": "would-fail"},
        "Deployment/deeper": {"amd64": "error"},
        "Deployment/web": {"amd64": "ready"},
    }
    by_name = {w["name"]: w["architectures"]["amd64"]["containers"][0] for w in doc["workloads"]}
    assert [f["path"] for f in by_name["deep"]["findings"]] == ["/" + deep_path(1200)]
    message = by_name["deeper"]["message"]
    assert "deeper than 2048" in message and "\n" not in message


def test_every_image_failure_is_that_workloads_error_verdict(tmp_path: Path) -> None:
    """The engine alone, against a registry that serves whatever it is given: an image too
    deep to check, a layer longer than declared, a digest that is a path. Each is an ERROR
    verdict with its one-line cause; the others are checked as usual; nothing is raised."""
    hostile = HostileRegistry()
    try:
        tar = "application/vnd.oci.image.layer.v1.tar"
        config = Image([]).config()

        def image(name: str, layer: dict[str, Any]) -> str:
            return hostile.image(f"team/{name}:1", config, [layer])

        refs = {
            "deep": image("deep", hostile.blob(layer_tar([file(deep_path(1200), b"#!/x\n")]), tar)),
            "deeper": image("deeper", hostile.blob(layer_tar([file(deep_path(3000), b"")]), tar)),
            "liar": image(
                "liar", hostile.blob(layer_tar([file("run", b"#!/x\n")]), tar) | {"size": 9}
            ),
            "escape": image(
                "escape", {"mediaType": tar, "digest": "sha256:../../../../etc/passwd", "size": 9}
            ),
        }
        workloads = [
            Workload("Deployment", "x", name, {}, [Container("main", ref)])
            for name, ref in refs.items()
        ]
        options = RegistryOptions(insecure=frozenset({hostile.host}), cache_dir=str(tmp_path))
        auditor = ImageAuditor(options, Limits(), str(tmp_path))
        report = run_audit(Inventory(workloads, [ClusterNode("n1", "amd64", "linux")]), [], auditor)
    finally:
        hostile.close()
    verdicts = {w.workload.name: w.archs[0].containers[0].verdict for w in report.workloads}
    assert {n: v.status for n, v in verdicts.items()} == {
        "deep": Outcome.FAILS,
        "deeper": Outcome.UNKNOWN,
        "liar": Outcome.UNKNOWN,
        "escape": Outcome.UNKNOWN,
    }
    assert "deeper than 2048" in verdicts["deeper"].message
    assert "its descriptor says 9" in verdicts["liar"].message
    assert "invalid digest 'sha256:../../" in verdicts["escape"].message
    assert all("\n" not in v.message for v in verdicts.values())


def test_an_image_that_exhausts_its_process_is_an_error_and_the_audit_goes_on(
    tmp_path: Path,
) -> None:
    """Each image is scanned in a process of its own (scan.isolated): one whose tree needs
    more memory than that process may take is stopped and is its workload's ERROR verdict;
    the next image is checked as usual, in a fresh process."""
    hostile = HostileRegistry()
    try:
        tar = "application/vnd.oci.image.layer.v1.tar"
        config = Image([]).config()
        names = [file(f"d/{i:04d}" + "x" * (400 << 10), b"") for i in range(200)]
        refs = {
            "hungry": hostile.image("team/hungry:1", config, [hostile.blob(layer_tar(names), tar)]),
            "plain": hostile.image(
                "team/plain:1", config, [hostile.blob(layer_tar([file("run", b"#!/x\n")]), tar)]
            ),
        }
        workloads = [
            Workload("Deployment", "x", name, {}, [Container("main", ref)])
            for name, ref in refs.items()
        ]
        options = RegistryOptions(insecure=frozenset({hostile.host}), cache_dir=str(tmp_path))
        process = ProcessLimits(memory=64 * MiB, cpu_s=60, wall_s=60)
        auditor = ImageAuditor(options, Limits(), str(tmp_path), process)
        report = run_audit(Inventory(workloads, [ClusterNode("n1", "amd64", "linux")]), [], auditor)
    finally:
        hostile.close()
    verdicts = {w.workload.name: w.archs[0].containers[0].verdict for w in report.workloads}
    assert verdicts["hungry"].status is Outcome.UNKNOWN
    assert "over its memory budget (64 MiB)" in verdicts["hungry"].message
    assert verdicts["plain"].status is Outcome.FAILS
