"""A real Prometheus for the node: docs/install.md's scrape configuration, verbatim, plus
what a Prometheus outside the cluster needs to reach the API server, and the shipped rules.

Prometheus itself is built by dev/k8s-tools.sh: Debian's is built without kubernetes_sd."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from tests.support.deploy.chart import REPO
from tests.support.kube.apiserver import binary_dir
from tests.support.kubenode.kubelet_node import Node
from tests.support.monitoring.prometheus_server import Prometheus

INSTALL_DOC = REPO / "docs" / "install.md"
RULES = REPO / "deploy" / "prometheus" / "execwatch-rules.yaml"


def documented_config() -> dict[str, Any]:
    """The YAML block of the "Without prometheus-operator" section of docs/install.md."""
    text = INSTALL_DOC.read_text()
    section = text[text.index("## Without prometheus-operator") :]
    block = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert block, "docs/install.md: no scrape configuration"
    config: dict[str, Any] = yaml.safe_load(block.group(1))
    return config


def start_prometheus(node: Node, workdir: Path) -> Prometheus:
    workdir.mkdir(parents=True, exist_ok=True)
    config = documented_config()
    (workdir / "execwatch-rules.yaml").write_text(RULES.read_text())
    config["rule_files"] = [str(workdir / f) for f in config["rule_files"]]
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    for job in config["scrape_configs"]:
        job["scrape_interval"] = "1s"
        for sd in job["kubernetes_sd_configs"]:
            sd["api_server"] = node.url
            sd["tls_config"] = {
                "ca_file": str(node.pki / "ca.crt"),
                "cert_file": str(node.pki / "admin.crt"),
                "key_file": str(node.pki / "admin.key"),
            }
    binary = binary_dir() / "prometheus"
    if not binary.exists():
        raise FileNotFoundError(
            f"{binary} missing: run dev/k8s-tools.sh (Debian's lacks kubernetes_sd)"
        )
    return Prometheus(workdir, config=config, binary=str(binary))
