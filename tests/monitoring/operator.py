"""prometheus-operator against the test control plane, and a real Prometheus running what
it generates.

The operator (built by dev/k8s-tools.sh) turns a Prometheus resource and the
ServiceMonitors and PrometheusRules it selects into the Secret `prometheus-<name>`
(`prometheus.yaml.gz`) and the ConfigMaps `prometheus-<name>-rulefiles-N`; in a cluster
its config-reloader hands them to Prometheus. Here nothing runs the StatefulSet: the test
reads both and starts the Prometheus that dev/k8s-tools.sh builds, with only what a pod
would get from its environment filled in (the API server's address and credentials, the
rule files' directory, the config-reloader's $(POD_NAME) and $(SHARD)).
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.support.kube.apiserver import ADMIN_TOKEN, KubeCluster, binary_dir, free_port
from tests.support.monitoring.prometheus_server import Prometheus

Doc = dict[str, Any]
RULES_DIR = "/etc/prometheus/rules/"  # where the operator mounts its rule ConfigMaps
# What its Prometheus controller watches (it runs without the optional ScrapeConfig).
CRDS = ("prometheuses", "servicemonitors", "podmonitors", "probes", "prometheusrules")


def operator_binary() -> Path:
    """The operator, or a loud failure naming the step that builds it."""
    path = binary_dir() / "prometheus-operator"
    if not os.access(path, os.X_OK):
        raise FileNotFoundError(
            f"{path} missing: run dev/k8s-tools.sh DIR prometheus-operator (make test does)"
        )
    return path


def operator_crds() -> list[Doc]:
    """The CRDs of CRDS, as shipped with the operator's sources (copied beside it)."""
    crds = operator_binary().parent / "prometheus-operator-crds"
    paths = [crds / f"monitoring.coreos.com_{name}.yaml" for name in CRDS]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"missing {', '.join(missing)}: rerun dev/k8s-tools.sh")
    return [d for p in paths for d in yaml.safe_load_all(p.read_text()) if d]


@contextmanager
def running_operator(kube: KubeCluster, workdir: Path) -> Iterator[Path]:
    """The operator watching every namespace with the admin's credentials, its
    configuration resources' status subresource on (so acceptance is visible); yields
    its log."""
    binary = operator_binary()
    workdir.mkdir(parents=True, exist_ok=True)
    kubeconfig = kube.kubeconfig(ADMIN_TOKEN, workdir / "operator.kubeconfig")
    log = workdir / "operator.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                str(binary),
                f"--web.listen-address=127.0.0.1:{free_port()}",
                "--feature-gates=StatusForConfigurationResources=true",
                "--log-level=warn",
            ],
            env={**os.environ, "KUBECONFIG": str(kubeconfig)},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield log
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


@dataclass(frozen=True)
class Generated:
    """What the operator wrote for one Prometheus resource."""

    config: Doc  # prometheus.yaml.gz of the Secret prometheus-<name>
    rule_files: dict[str, dict[str, str]]  # ConfigMap name -> file name -> text

    def job(self, job_name: str) -> Doc:
        jobs = [j for j in self.config.get("scrape_configs", []) if j["job_name"] == job_name]
        assert len(jobs) == 1, (job_name, [j["job_name"] for j in self.config["scrape_configs"]])
        found: Doc = jobs[0]
        return found

    def rules(self) -> list[Doc]:
        """Every rule of every rule file."""
        return [
            rule
            for files in self.rule_files.values()
            for text in files.values()
            for group in yaml.safe_load(text)["groups"]
            for rule in group["rules"]
        ]


def generated(api: client.ApiClient, namespace: str, name: str) -> Generated | None:
    """The operator's output for Prometheus `namespace/name`, None until it is written."""
    core = client.CoreV1Api(api)
    try:
        secret = core.read_namespaced_secret(f"prometheus-{name}", namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    packed = (secret.data or {}).get("prometheus.yaml.gz")
    if not packed:
        return None
    config: Doc = yaml.safe_load(gzip.decompress(base64.b64decode(packed)))
    maps = core.list_namespaced_config_map(
        namespace, label_selector=f"prometheus-name={name},managed-by=prometheus-operator"
    )
    rule_files = {m.metadata.name: dict(m.data or {}) for m in maps.items}
    return Generated(config, rule_files)


def run_generated(kube: KubeCluster, found: Generated, workdir: Path, pod_name: str) -> Prometheus:
    """Prometheus with the generated configuration, as its pod would run it."""
    workdir.mkdir(parents=True, exist_ok=True)
    token = workdir / "token"
    token.write_text(ADMIN_TOKEN)
    rules = workdir / "rules"
    for configmap, files in found.rule_files.items():
        (rules / configmap).mkdir(parents=True, exist_ok=True)
        for file_name, text in files.items():
            (rules / configmap / file_name).write_text(text)
    # The config-reloader's substitutions: its pod's name and its shard (one shard).
    text = json.dumps(found.config).replace("$(POD_NAME)", pod_name).replace("$(SHARD)", "0")
    config: Doc = json.loads(text)
    config["rule_files"] = [
        str(rules / f.removeprefix(RULES_DIR)) for f in config.get("rule_files", [])
    ]
    for job in config.get("scrape_configs", []):
        for sd in job.get("kubernetes_sd_configs", []):
            assert "api_server" not in sd, sd  # in-cluster: the pod's service account
            sd["api_server"] = kube.url
            sd["tls_config"] = {"ca_file": str(kube.ca)}
            sd["authorization"] = {"credentials_file": str(token)}
    binary = binary_dir() / "prometheus"
    if not binary.exists():
        raise FileNotFoundError(f"{binary} missing: run dev/k8s-tools.sh DIR prometheus")
    return Prometheus(workdir, config=config, binary=str(binary))
