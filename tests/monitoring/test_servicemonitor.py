"""The chart's ServiceMonitors and PrometheusRule through a real prometheus-operator, and a
real Prometheus running the configuration it generates (docs/metrics.md).

The handler is a real `execwatch handler` process; the agent's target serves the agent's
publisher metrics with execwatch's metrics server. Their Pods, Endpoints and
EndpointSlices are made by hand (no kubelet, no controller-manager: tests/monitoring/
targets.py). A failing pod of Deployment `web` in namespace `shop` gets records from the
agent's credentials; the handler turns them into execwatch_exec_failures_total.

Two Prometheus resources select the chart's objects: a plain one, and one with the
settings OpenShift's user-workload monitoring gives its Prometheus (cluster-monitoring-
operator's assets/prometheus-user-workload/prometheus.yaml), where the `namespace` label
is enforced.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from execwatch.agent.metrics import PublisherMetrics
from execwatch.serving.exposition import serve
from tests.cluster.conftest import publish
from tests.monitoring.operator import (
    Generated,
    generated,
    operator_crds,
    run_generated,
    running_operator,
)
from tests.monitoring.targets import Target, expose, local_address
from tests.support.agent.exec_failures import exec_failure
from tests.support.deploy.chart import CHART, find, render
from tests.support.kube.apiserver import KubeCluster, apply, ensure_namespace
from tests.support.kube.apiserver_fixtures import AGENT_NODE, AGENT_SA, HANDLER_SA
from tests.support.monitoring.prometheus_server import Prometheus, free_port
from tests.support.wait import wait_until

NAMESPACE = "execwatch"
FAILING = ("shop", "web", "app")  # the failing pod's namespace, Deployment, container
HANDLER_POD = "execwatch-handler-6d8f7c9b5-q4m2z"
AGENT_POD = "execwatch-agent-x7k2p"
LEAF = "openshift.io/prometheus-rule-evaluation-scope"  # UWM Prometheus evaluates these
VARIANT = "execwatch.test/openshift-variant"
CHART_VALUES = (
    "serviceMonitor.enabled=true",
    "prometheusRule.enabled=true",
    "serviceMonitor.interval=1s",
    "serviceMonitor.scrapeTimeout=1s",
    f"prometheusRule.labels.{LEAF.replace('.', chr(92) + '.')}=leaf-prometheus",
)
PLAIN = ("monitoring", "k8s")
UWM = ("openshift-user-workload-monitoring", "user-workload")
NOT_CLUSTER_MONITORING = {
    "matchExpressions": [
        {"key": "openshift.io/cluster-monitoring", "operator": "NotIn", "values": ["true"]}
    ]
}
JOBS = {"execwatch-agent": (AGENT_POD, "agent"), "execwatch-handler": (HANDLER_POD, "handler")}


def prometheus_resource(namespace: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "Prometheus",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"scrapeInterval": "1s", "evaluationInterval": "1s", **spec},
    }


PLAIN_SPEC = {
    "serviceMonitorSelector": {},
    "serviceMonitorNamespaceSelector": {},
    "ruleSelector": {"matchExpressions": [{"key": VARIANT, "operator": "DoesNotExist"}]},
    "ruleNamespaceSelector": {},
}
UWM_SPEC = {  # what cluster-monitoring-operator sets that shapes the configuration
    "enforcedNamespaceLabel": "namespace",
    "ignoreNamespaceSelectors": True,
    "overrideHonorLabels": True,
    "overrideHonorTimestamps": True,
    "serviceMonitorSelector": {},
    "serviceMonitorNamespaceSelector": NOT_CLUSTER_MONITORING,
    "ruleSelector": {"matchLabels": {LEAF: "leaf-prometheus"}},
    "ruleNamespaceSelector": NOT_CLUSTER_MONITORING,
}


def openshift_variant(rule: dict[str, Any]) -> dict[str, Any]:
    """docs/metrics.md's recipe for user-workload monitoring: the failing pod's namespace
    and container are exported_namespace and exported_container there."""
    expr = re.sub(
        r"by \(namespace, workload, container,",
        "by (exported_namespace, workload, exported_container,",
        rule["expr"],
    )
    assert expr != rule["expr"], rule["expr"]
    annotations = {
        k: re.sub(r"\$labels\.(namespace|container)\b", r"$labels.exported_\1", v)
        for k, v in rule["annotations"].items()
    }
    return {**rule, "expr": expr, "annotations": annotations}


@dataclass(frozen=True)
class Stack:
    kube: KubeCluster
    api: client.ApiClient
    chart: list[dict[str, Any]]
    plain: Generated
    uwm: Generated
    prometheus: Prometheus  # runs `plain`
    uwm_prometheus: Prometheus

    def alerts(self, prometheus: Prometheus, name: str) -> list[dict[str, str]]:
        data = prometheus.query(f'ALERTS{{alertname="{name}"}}')
        return [s["metric"] for s in data["result"]]


class HandlerProcess:
    """`execwatch handler` with the handler ServiceAccount's token, metrics on address."""

    def __init__(self, kube: KubeCluster, workdir: Path, address: str, port: int) -> None:
        token = kube.service_account_token(*HANDLER_SA)
        kubeconfig = kube.kubeconfig(token, workdir / "handler.kubeconfig")
        self.url = f"http://{address}:{port}/metrics"
        self.log = workdir / "handler.log"
        argv = [sys.executable, "-m", "execwatch.cli", "handler", "--kubeconfig", str(kubeconfig)]
        argv += ["--identity", HANDLER_POD, "--metrics-address", f"{address}:{port}"]
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)

    def leads(self) -> bool:
        try:
            with urllib.request.urlopen(self.url, timeout=2) as r:
                text: str = r.read().decode()
        except OSError:
            assert self.proc.poll() is None, self.log.read_text()
            return False
        return "execwatch_handler_leader 1.0" in text

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def failing_pod(api: client.ApiClient) -> dict[str, Any]:
    """A pod of Deployment `web` (its ReplicaSet carries pod-template-hash) on AGENT_NODE."""
    namespace, deployment, container = FAILING
    ensure_namespace(api, namespace)
    pod = client.CoreV1Api(api).create_namespaced_pod(
        namespace,
        {
            "metadata": {
                "name": f"{deployment}-7d9f8b6c5d-x2x4k",
                "labels": {"pod-template-hash": "7d9f8b6c5d"},
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "ReplicaSet",
                        "controller": True,
                        "name": f"{deployment}-7d9f8b6c5d",
                        "uid": "0b0e7c3e-9a52-4a8b-8c55-1d1f0a6b7c21",
                    }
                ],
            },
            "spec": {
                "nodeName": AGENT_NODE,
                "containers": [{"name": container, "image": "registry.example/web:1"}],
            },
        },
    )
    data: dict[str, Any] = api.sanitize_for_serialization(pod)
    return data


def apply_chart(api: client.ApiClient, chart: list[dict[str, Any]]) -> None:
    """The chart's Services, ServiceMonitors and PrometheusRule, and the recipe's variant."""
    wanted = {"Service", "ServiceMonitor", "PrometheusRule"}
    apply(api, [d for d in chart if d["kind"] in wanted])
    rule = find(chart, "PrometheusRule")
    [failures] = [
        r
        for g in rule["spec"]["groups"]
        for r in g["rules"]
        if r.get("alert") == "ExecwatchExecFailures"
    ]
    variant = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "execwatch-openshift",
            "namespace": NAMESPACE,
            "labels": {LEAF: "leaf-prometheus", VARIANT: "true"},
        },
        "spec": {
            "groups": [{"name": "execwatch-openshift", "rules": [openshift_variant(failures)]}]
        },
    }
    apply(api, [variant])


def targets(chart: list[dict[str, Any]], address: str, ports: dict[str, int]) -> list[Target]:
    handler = find(chart, "Deployment", "execwatch-handler")["spec"]["template"]
    agent = find(chart, "DaemonSet", "execwatch-agent")["spec"]["template"]
    return [
        Target(
            find(chart, "Service", "execwatch-handler"),
            handler,
            HANDLER_POD,
            AGENT_NODE,
            address,
            ports["handler"],
        ),
        Target(
            find(chart, "Service", "execwatch-agent"),
            agent,
            AGENT_POD,
            AGENT_NODE,
            address,
            ports["agent"],
        ),
    ]


@pytest.fixture(scope="module")
def stack(kube: KubeCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("monitoring")
    chart = render(*CHART_VALUES, namespace=NAMESPACE)
    address = local_address()
    ports = {"handler": free_port(), "agent": free_port()}
    with kube.client() as api:
        apply(api, operator_crds())
        for ns in (*(p[0] for p in (PLAIN, UWM)), NAMESPACE):
            ensure_namespace(api, ns)
        apply_chart(api, chart)
        for target in targets(chart, address, ports):
            expose(api, target)
        handler = HandlerProcess(kube, workdir, address, ports["handler"])
        agent_metrics = serve((address, ports["agent"]), PublisherMetrics().registry)
        running: list[Prometheus] = []
        try:
            with running_operator(kube, workdir / "operator") as log:
                apply(
                    api,
                    [prometheus_resource(*PLAIN, PLAIN_SPEC), prometheus_resource(*UWM, UWM_SPEC)],
                )
                wait_until(handler.leads, timeout=30)
                with kube.client(kube.node_token(*AGENT_SA, AGENT_NODE)) as agent_api:
                    pod = failing_pod(api)
                    publish(agent_api, exec_failure(pod=pod, container=FAILING[2], count=3))
                    publish(agent_api, exec_failure(pod=pod, container="sidecar-gone"))
                plain = wait_until(
                    lambda: generated(api, *PLAIN), timeout=30, explain=log.read_text
                )
                uwm = wait_until(lambda: generated(api, *UWM), timeout=30, explain=log.read_text)
                running.append(run_generated(kube, plain, workdir / "plain", "prometheus-k8s-0"))
                running.append(
                    run_generated(kube, uwm, workdir / "uwm", "prometheus-user-workload-0")
                )
                yield Stack(kube, api, chart, plain, uwm, *running)
        finally:
            for p in running:
                p.stop()
            agent_metrics.shutdown()
            handler.stop()


def status(api: client.ApiClient, kind: str, name: str) -> dict[str, Any]:
    obj = client.CustomObjectsApi(api).get_namespaced_custom_object(
        "monitoring.coreos.com", "v1", NAMESPACE, kind, name
    )
    found: dict[str, Any] = obj.get("status", {})
    return found


def accepted(api: client.ApiClient, kind: str, name: str) -> list[str]:
    """The Prometheus resources that report `kind/name` Accepted in its status."""
    return [
        f"{b['namespace']}/{b['name']}"
        for b in status(api, kind, name).get("bindings", [])
        if any(c["type"] == "Accepted" and c["status"] == "True" for c in b.get("conditions", []))
    ]


def test_the_operator_accepts_the_charts_servicemonitors_and_rule(stack: Stack) -> None:
    both = ["/".join(PLAIN), "/".join(UWM)]
    monitors = ["execwatch-agent", "execwatch-handler"]
    wait_until(
        lambda: all(sorted(accepted(stack.api, "servicemonitors", n)) == both for n in monitors),
        timeout=30,
        explain=lambda: str({n: status(stack.api, "servicemonitors", n) for n in monitors}),
    )
    # The handler's labels describe the failing pod: they win over the target's.
    assert stack.plain.job("serviceMonitor/execwatch/execwatch-handler/0")["honor_labels"] is True
    assert stack.plain.job("serviceMonitor/execwatch/execwatch-agent/0")["honor_labels"] is False
    # PrometheusRules report no status in this release: each valid one becomes a rule file.
    shipped = find(stack.chart, "PrometheusRule")["spec"]["groups"]
    alerts = sorted(r["alert"] for g in shipped for r in g["rules"] if "alert" in r)
    variant = ["ExecwatchExecFailures"]  # docs/metrics.md's recipe, for the UWM one only
    for found, expected in ((stack.plain, alerts), (stack.uwm, sorted(alerts + variant))):
        assert sorted(r["alert"] for r in found.rules() if "alert" in r) == expected


def active_targets(prometheus: Prometheus) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = prometheus.get("/api/v1/targets?state=active")["activeTargets"]
    return found


def test_each_target_gets_the_operators_labels(stack: Stack) -> None:
    def up() -> list[dict[str, Any]]:
        found = active_targets(stack.prometheus)
        return found if len(found) == 2 and all(t["health"] == "up" for t in found) else []

    by_job = {t["labels"]["job"]: t["labels"] for t in wait_until(up, timeout=30)}
    assert sorted(by_job) == sorted(JOBS)
    for job, (pod, container) in JOBS.items():
        labels = by_job[job]
        assert labels["namespace"] == NAMESPACE and labels["service"] == job
        assert labels["pod"] == pod and labels["container"] == container
        assert labels["endpoint"] == "metrics"
    assert by_job["execwatch-agent"]["node"] == AGENT_NODE  # the agent's relabeling


def series(prometheus: Prometheus, promql: str) -> list[dict[str, str]]:
    return [s["metric"] for s in prometheus.query(promql)["result"]]


def test_the_alert_names_the_failing_pods_namespace_workload_and_container(stack: Stack) -> None:
    namespace, workload, container = FAILING
    alerts = wait_until(lambda: stack.alerts(stack.prometheus, "ExecwatchExecFailures"), timeout=30)
    assert {(a["namespace"], a["workload"], a.get("container")) for a in alerts} == {
        (namespace, workload, container),
        (namespace, workload, None),  # a container the pod does not have: no name, not ours
    }
    failures = series(stack.prometheus, "execwatch_exec_failures_total")
    assert all(not k.startswith("exported_") for s in failures for k in s), failures
    assert {s["job"] for s in failures} == {"execwatch-handler"}
    # Nor the handler's pod: the series name none (handler.podLabelMetric is off).
    assert {s.get("pod") for s in failures} == {None}
    [leader] = series(stack.prometheus, "execwatch_handler_leader")
    assert (leader["namespace"], leader["pod"]) == (NAMESPACE, HANDLER_POD)


def label_values(prometheus: Prometheus, query: str) -> list[str]:
    """Grafana's label_values(METRIC, LABEL) and label_values(LABEL), as its Prometheus
    data source runs them (the label values API)."""
    m = re.fullmatch(r"label_values\((?:(.+),\s*)?(\w+)\)", query.strip())
    assert m, f"a variable query this test does not know: {query}"
    metric, label = m.groups()
    path = f"/api/v1/label/{label}/values"
    if metric:
        path += "?" + urllib.parse.urlencode({"match[]": metric})
    values: list[str] = prometheus.get(path)
    return values


def test_the_dashboards_variables_return_values(stack: Stack) -> None:
    dashboard = json.loads((CHART / "files" / "execwatch.json").read_text())
    queries = {
        v["name"]: v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
        for v in dashboard["templating"]["list"]
        if v["type"] == "query"
    }
    assert queries, "the dashboard has no query variables"
    wait_until(lambda: stack.alerts(stack.prometheus, "ExecwatchExecFailures"), timeout=30)
    got = {name: label_values(stack.prometheus, q) for name, q in queries.items()}
    assert got["namespace"] == [FAILING[0]], got


def panel_value(prometheus: Prometheus, dashboard: dict[str, Any], title: str) -> float:
    """A stat panel's value over the last hour, as Grafana would ask for it."""
    [panel] = [p for p in dashboard["panels"] if p.get("title") == title]
    expr = panel["targets"][0]["expr"].replace("$__range", "1h").replace("$namespace", ".*")
    [result] = prometheus.query(expr)["result"]
    return float(result["value"][1])


def test_the_dashboards_range_panels_count_series_born_in_the_range(stack: Stack) -> None:
    """The handler's counters are born at their first failure's count: increase() alone
    never sees that first step, and the panels read 0 while the alert fires."""
    dashboard = json.loads((CHART / "files" / "execwatch.json").read_text())
    wait_until(lambda: stack.alerts(stack.prometheus, "ExecwatchExecFailures"), timeout=30)
    [total] = stack.prometheus.query("sum(execwatch_exec_failures_total)")["result"]
    assert float(total["value"][1]) > 0
    assert panel_value(stack.prometheus, dashboard, "Failed execs (range)") == float(
        total["value"][1]
    )
    assert panel_value(stack.prometheus, dashboard, "Workloads affected (range)") == 1.0


def test_openshift_user_workload_monitoring_enforces_execwatchs_namespace(stack: Stack) -> None:
    namespace, workload, container = FAILING
    job = stack.uwm.job("serviceMonitor/execwatch/execwatch-handler/0")
    assert job["honor_labels"] is False  # overrideHonorLabels
    enforced = {"target_label": "namespace", "replacement": NAMESPACE}
    assert enforced in job["relabel_configs"] and enforced in job["metric_relabel_configs"]
    rules = {r["alert"]: r for r in stack.uwm.rules() if "alert" in r}
    assert f'namespace="{NAMESPACE}"' in rules["ExecwatchExecFailures"]["expr"]

    # The failing pod's namespace and container arrive renamed...
    def failures() -> list[dict[str, str]]:
        return series(stack.uwm_prometheus, 'execwatch_exec_failures_total{container="handler"}')

    got = wait_until(failures, timeout=30)
    assert {
        (s["namespace"], s["exported_namespace"], s.get("exported_container")) for s in got
    } == {
        (NAMESPACE, namespace, container),
        (NAMESPACE, namespace, None),
    }

    # ...so the shipped alert names execwatch's namespace and the handler's container,
    # and the documented variant the failing pod's.
    def both() -> list[dict[str, str]]:
        alerts = stack.alerts(stack.uwm_prometheus, "ExecwatchExecFailures")
        return alerts if len({"exported_namespace" in a for a in alerts}) == 2 else []

    alerts = wait_until(both, timeout=30)
    shipped = [a for a in alerts if "exported_namespace" not in a]
    variant = [a for a in alerts if "exported_namespace" in a]
    assert {(a["namespace"], a["workload"], a["container"]) for a in shipped} == {
        (NAMESPACE, workload, "handler")
    }
    assert {
        (a["namespace"], a["exported_namespace"], a["workload"], a.get("exported_container"))
        for a in variant
    } == {(NAMESPACE, namespace, workload, container), (NAMESPACE, namespace, workload, None)}


def test_the_pod_label_is_dropped_only_when_the_handler_sets_none() -> None:
    docs = render(*CHART_VALUES, "handler.podLabelMetric=true", namespace=NAMESPACE)
    [endpoint] = find(docs, "ServiceMonitor", "execwatch-handler")["spec"]["endpoints"]
    assert endpoint["honorLabels"] is True and "metricRelabelings" not in endpoint
    [endpoint] = find(render(*CHART_VALUES), "ServiceMonitor", "execwatch-handler")["spec"][
        "endpoints"
    ]
    assert endpoint["metricRelabelings"][0]["regex"] == "execwatch_exec_failures_.+"
