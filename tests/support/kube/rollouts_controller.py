"""The real Argo Rollouts controller (built by dev/k8s-tools.sh) and its CRDs, against any
API server a kubeconfig names: tests/node's kubelet node or tests/kube's control plane."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from tests.support.kube.apiserver import Proc, apply, binary_dir, free_port


@contextmanager
def rollouts_controller(api: client.ApiClient, kubeconfig: Path, workdir: Path) -> Iterator[Proc]:
    """Apply the Argo Rollouts CRDs, run the controller until the block ends."""
    bins = binary_dir()
    crds = sorted((bins / "argo-rollouts-crds").glob("*.yaml"))
    controller = bins / "rollouts-controller"
    if not crds or not controller.exists():
        pytest.fail(f"{controller} or its CRDs missing: run dev/k8s-tools.sh", pytrace=False)
    apply(api, [yaml.safe_load(p.read_text()) for p in crds])
    proc = Proc(
        "rollouts-controller",
        [
            str(controller),
            f"--kubeconfig={kubeconfig}",
            f"--metricsPort={free_port()}",
            f"--healthzPort={free_port()}",
            "--leader-elect=false",
            "--loglevel=info",
        ],
        workdir / "rollouts-controller.log",
    )
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()
