"""Argo Rollouts with execwatch's shipped AnalysisTemplate, for real: the controller built by
dev/k8s-tools.sh, its CRDs, a Rollout from a healthy v1 to a v2 whose entrypoint is a glibc
binary in a musl image. The canary's AnalysisRun queries the real Prometheus that scrapes the
real handler; it fails, the rollout aborts, v1 keeps serving.

The kube-state-metrics companion (deploy/argo/pod-restart-analysis.yaml) is not run here:
kube-state-metrics cannot be built on this machine (the module proxy refuses it); its query is
proven with promtool in tests/deploy/test_argo.py.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client

from tests.support.deploy.chart import REPO
from tests.support.kube.apiserver import Proc, apply
from tests.support.kube.rollouts_controller import rollouts_controller as start_controller
from tests.support.kubenode.helm_install import Release
from tests.support.kubenode.kubelet_node import Node, pod_ready, wait_for
from tests.support.kubenode.node_images import WEB_V1, WEB_V2_MUSL
from tests.support.kubenode.story_workloads import ensure_namespace, http_get, pods, restarts
from tests.support.monitoring.prometheus_server import Prometheus

ARGO = REPO / "deploy" / "argo"
NS = "rollouts"
GROUP, VERSION = "argoproj.io", "v1alpha1"


@pytest.fixture(scope="module")
def rollouts_controller(node: Node) -> Iterator[Proc]:
    with node.client() as api, start_controller(api, node.kubeconfig, node.workdir) as proc:
        yield proc


def rollout_from_example(prometheus: Prometheus) -> dict[str, Any]:
    """deploy/argo/rollout-example.yaml, adapted as its comment says: name, namespace, image,
    steps; only execwatch's template (see the module docstring)."""
    (doc,) = [d for d in yaml.safe_load_all((ARGO / "rollout-example.yaml").read_text()) if d]
    rollout: dict[str, Any] = copy.deepcopy(doc)
    rollout["metadata"]["namespace"] = NS
    rollout["spec"]["replicas"] = 2
    ctr = rollout["spec"]["template"]["spec"]["containers"][0]
    ctr.update(image=WEB_V1, imagePullPolicy="Never")
    rollout["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 1
    canary = rollout["spec"]["strategy"]["canary"]
    analysis = canary["analysis"]
    analysis["templates"] = [
        t for t in analysis["templates"] if t["templateName"].startswith("execwatch")
    ]
    analysis["args"].append({"name": "prometheus-address", "value": prometheus.url})
    canary["steps"] = [{"setWeight": 50}, {"pause": {}}]
    return rollout


def test_canary_with_a_glibc_entrypoint_on_musl_is_aborted_and_v1_keeps_serving(
    node: Node, release: Release, prometheus: Prometheus, rollouts_controller: Proc
) -> None:
    ensure_namespace(node, NS)
    api = node.client()
    custom = client.CustomObjectsApi(api)
    template = yaml.safe_load((ARGO / "execwatch-exec-failures.yaml").read_text())
    template["metadata"]["namespace"] = NS
    rollout = rollout_from_example(prometheus)
    apply(api, [template, rollout])
    name = rollout["metadata"]["name"]

    def get() -> dict[str, Any]:
        obj: dict[str, Any] = custom.get_namespaced_custom_object(
            GROUP, VERSION, NS, "rollouts", name
        )
        return obj

    wait_for(
        "v1 Healthy",
        lambda: (
            get().get("status", {}).get("phase") == "Healthy"
            and len([p for p in pods(node, NS, f"app={name}") if pod_ready(p)]) == 2
        ),
        120,
    )
    stable_hash = get()["status"]["stableRS"]
    for pod in pods(node, NS, f"app={name}"):
        assert http_get(pod) == "v1"

    custom.patch_namespaced_custom_object(
        GROUP, VERSION, NS, "rollouts", name,
        {"spec": {"template": {"spec": {"containers": [{"name": name, "image": WEB_V2_MUSL}]}}}},
    )  # fmt: skip

    aborted = wait_for(
        "the rollout aborted",
        lambda: (r := get()).get("status", {}).get("abort") and r,
        240,
        every=1,
    )
    canary_hash = aborted["status"]["currentPodHash"]
    assert canary_hash != stable_hash
    assert aborted["status"]["phase"] == "Degraded"

    runs = custom.list_namespaced_custom_object(GROUP, VERSION, NS, "analysisruns")["items"]
    (run,) = [
        r for r in runs if r["metadata"]["labels"].get("rollouts-pod-template-hash") == canary_hash
    ]
    assert run["status"]["phase"] == "Failed"
    (metric,) = run["status"]["metricResults"]
    assert metric["name"] == "exec-failures" and metric["phase"] == "Failed"
    failed = [m for m in metric["measurements"] if m["phase"] == "Failed"]
    assert failed and float(failed[-1]["value"].strip("[]")) > 0

    # The canary crash-looped (exit 127: its ELF loader is missing) and is scaled away.
    wait_for(
        "canary pods gone",
        lambda: not [p for p in pods(node, NS, f"rollouts-pod-template-hash={canary_hash}")],
        60,
    )
    stable = [p for p in pods(node, NS, f"rollouts-pod-template-hash={stable_hash}")]
    assert len(stable) == 2
    for pod in stable:
        assert pod_ready(pod) and restarts(pod) == 0
        assert http_get(pod) == "v1"
