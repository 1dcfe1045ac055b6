"""One real node for the whole of tests/node, execwatch installed on it with helm.

Order matters and is the file order: test_install (the install), test_node,
test_story, then test_uninstall (upgrade, uninstall and the node's own teardown).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.node.prometheus import start_prometheus
from tests.support.kubenode.helm_install import Release, helm_install
from tests.support.kubenode.kubelet_node import Node, NodeError, running_node
from tests.support.kubenode.node_images import build_workloads, require_execwatch_archive
from tests.support.monitoring.prometheus_server import Prometheus


@pytest.fixture(scope="session")
def node() -> Iterator[Node]:
    """etcd, kube-apiserver, controller-manager, scheduler, containerd, kubelet: Ready."""
    try:
        archive = require_execwatch_archive()
        with running_node(Path(tempfile.mkdtemp(prefix="ew-node-"))) as n:
            n.import_image(archive)
            for workload in build_workloads(n.workdir / "workloads"):
                n.import_image(workload)
            yield n
    except (NodeError, FileNotFoundError) as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def release(node: Node) -> Release:
    """`helm install` of the chart as docs/install.md describes it, agent and handler Ready."""
    return helm_install(node)


@pytest.fixture(scope="session")
def prometheus(node: Node, release: Release) -> Iterator[Prometheus]:
    """A real Prometheus: the chart's Services through kubernetes_sd, the shipped rules."""
    prom = start_prometheus(node, node.workdir / "prometheus")
    try:
        yield prom
    finally:
        prom.stop()
