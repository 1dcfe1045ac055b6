"""The Grafana dashboard (and every other query we ship) names only real metrics."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from execwatch.agent.metrics import PublisherMetrics
from execwatch.binfmt.emulation import Emulator
from execwatch.handler.metrics import HandlerMetrics
from execwatch.node.metrics import NodeMetrics
from execwatch.node.stack import StackOptions
from execwatch.probe.loader import ProbeOptions
from execwatch.serving.exposition import serve
from tests.support.binfmt.emulation import (
    BinfmtNamespace,
    aarch64_entry,
    binfmt_namespace,
    busybox_arm64,
    qemu_aarch64,
)
from tests.support.deploy.chart import REPO, find, render
from tests.support.monitoring.prometheus_server import Prometheus
from tests.support.node.stack_runner import node_stack

__all__ = ["binfmt_namespace", "busybox_arm64"]  # fixtures

DASHBOARD = REPO / "deploy" / "grafana" / "execwatch.json"

# Not ours, and documented by their projects: Prometheus' own `up`, and the
# kube-state-metrics families the rules and the dashboard use (kube-state-metrics
# docs/metrics/workload/{pod,daemonset,deployment}-metrics.md; last_terminated_exitcode
# since v2.7.0).
FOREIGN = {
    "up",
    "kube_daemonset_status_desired_number_scheduled",
    "kube_daemonset_status_number_ready",
    "kube_pod_container_status_restarts_total",
    "kube_pod_container_status_last_terminated_exitcode",
}

PROMQL_WORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
    "offset", "bool", "inf", "nan",
}  # fmt: skip


class _Probe:
    def errno_totals(self) -> dict[int, int]:
        return {8: 1}

    def death_totals(self) -> dict[str, int]:
        return {"SIGSEGV": 1}

    def stats(self) -> dict[str, int]:
        return {"ringbuf_full": 0, "counter_map_full": 0, "death_ringbuf_full": 0}

    def shed_top(self) -> None:
        return None

    def binfmt_emulators(self) -> tuple[Emulator, ...]:
        return (Emulator("qemu-aarch64", "arm64", "/usr/bin/qemu-aarch64-static", "F"),)

    def emulated_totals(self) -> dict[str, int]:
        return {"arm64": 1}


def exported_names() -> set[str]:
    """Every sample name execwatch can export, from its own metric definitions."""
    registry = CollectorRegistry()
    NodeMetrics(registry, _Probe())
    PublisherMetrics(registry=registry)
    HandlerMetrics(registry=registry)
    suffixes = {
        "counter": ("_total", "_created"),
        "gauge": ("",),
        "histogram": ("_bucket", "_sum", "_count", "_created"),
    }
    names: set[str] = set()
    for family in registry.collect():
        names |= {family.name + s for s in suffixes[family.type]}
        names |= {s.name for s in family.samples}
    return names


def metric_names(promql: str) -> set[str]:
    """Metric names in a PromQL expression (label matchers, groupings, ranges removed)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', promql)  # strings
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges
    text = re.sub(r"\boffset\s+[-\w]+", "", text)  # offsets
    text = re.sub(r"(?<![\w:])\d[\w.]*", "", text)  # numbers, durations
    text = re.sub(
        r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text
    )  # groupings
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        word = m.group(0)
        after = text[m.end() :].lstrip()
        if after.startswith("(") or word.lower() in PROMQL_WORDS:
            continue  # a function or a keyword
        if text[: m.start()].endswith("$"):
            continue  # a Grafana variable
        names.add(word)
    return names


def test_metric_name_extraction() -> None:
    q = (
        'sum by (a, b) (increase(x_total{l="v{"}[5m]) > 0) or (y unless y offset 10m)'
        " or vector(0) + histogram_quantile(0.9, sum by (le) (rate(z_bucket[$__rate_interval])))"
    )
    assert metric_names(q) == {"x_total", "y", "z_bucket"}


def dashboard() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return doc


def exprs() -> list[str]:
    out = [t["expr"] for p in dashboard()["panels"] for t in p.get("targets", [])]
    for var in dashboard()["templating"]["list"]:
        if m := re.fullmatch(r"label_values\((.+),\s*\w+\)", var.get("definition", "")):
            out.append(m.group(1))  # the series selector of label_values(selector, label)
    return out


def test_dashboard_parses_and_is_laid_out() -> None:
    d = dashboard()
    assert d["uid"] == "execwatch"
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    for p in d["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24
        if p["type"] != "row":
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert p["targets"], p["title"]


def test_every_dashboard_query_names_only_exported_or_documented_metrics() -> None:
    known = exported_names() | FOREIGN
    used = set().union(*(metric_names(e) for e in exprs()))
    assert used, "no metric found: the extraction is broken"
    assert used <= known, f"unknown metrics: {used - known}"


def test_dashboard_shows_what_an_operator_asks_for() -> None:
    text = "\n".join(exprs())
    for grouping in (
        "by (reason)",
        "by (binary_arch, node_arch)",
        "by (namespace)",
        "by (node)",
        "topk(15, sum by (namespace, workload, container, reason, binary_arch, node_arch)",
        'up{job="execwatch-agent"}',
        "execwatch_kernel_dropped_total",
        "execwatch_publisher_dropped_total",
        "kube_daemonset_status_number_ready",
        "execwatch_handler_leader",
    ):
        assert grouping in text, grouping


def _rule_exprs() -> list[str]:
    rules = yaml.safe_load((REPO / "deploy/prometheus/execwatch-rules.yaml").read_text())
    return [r["expr"] for g in rules["groups"] for r in g["rules"]]


def _argo_queries() -> list[str]:
    """The Prometheus queries of the Argo templates (execwatch-scan-run's `job` provider
    has none)."""
    out = []
    for path in (REPO / "deploy" / "argo").glob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc["kind"] == "AnalysisTemplate":
                metrics = doc["spec"]["metrics"]
                out += [m["provider"]["prometheus"]["query"] for m in metrics
                        if "prometheus" in m["provider"]]  # fmt: skip
    assert out, "no Prometheus query in deploy/argo"
    return out


@pytest.mark.parametrize("source", ["alert rules", "argo templates"])
def test_alert_rules_and_argo_queries_name_only_real_metrics(source: str) -> None:
    queries = _rule_exprs() if source == "alert rules" else _argo_queries()
    known = exported_names() | FOREIGN
    used = set().union(*(metric_names(q) for q in queries))
    assert used and used <= known, f"unknown metrics: {used - known}"


def test_chart_ships_the_dashboard_unchanged() -> None:
    cm = find(render("grafanaDashboard.enabled=true"), "ConfigMap", "execwatch-dashboard")
    assert json.loads(cm["data"]["execwatch.json"]) == dashboard()


def panel(title: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [p for p in dashboard()["panels"] if p.get("title") == title]
    assert len(found) == 1, f"{len(found)} panels titled {title!r}"
    return found[0]


def grafana_expr(expr: str) -> str:
    """A panel's query as Grafana sends it: its variables replaced (all namespaces)."""
    for var, value in (("$__rate_interval", "30s"), ("$__range", "10m"), ("$namespace", ".*")):
        expr = expr.replace(var, value)
    return expr


EMULATED_RUNS = 3


def test_the_emulation_panels_show_a_real_emulated_exec_by_node_and_architecture(
    binfmt_namespace: BinfmtNamespace, busybox_arm64: Path, tmp_path: Path
) -> None:
    """Debian's qemu-aarch64-static registered in a table of its own runs Debian's arm64
    busybox; the real node stack counts it and a real Prometheus scrapes it (as node-a,
    the label the ServiceMonitor sets), with the handler's counter for the same execs in
    a pod: every emulation panel answers with that node, architecture and workload, and
    the failed-exec panels leave them out."""
    binfmt_namespace.register(aarch64_entry("qemu-aarch64", qemu_aarch64(), "F"))
    handler = HandlerMetrics()
    handler.count_failures(
        {"namespace": "shop", "workload": "web", "container": "app", "node": "node-a",
         "node_arch": "amd64", "binary_arch": "arm64", "reason": "Emulated"},
        EMULATED_RUNS,
    )  # fmt: skip
    options = StackOptions(probe=ProbeOptions(binfmt_table=binfmt_namespace.table))
    with (
        node_stack(options, loop="run") as running,
        serving(running.stack.registry) as agent,
        serving(handler.registry) as handler_address,
    ):
        prometheus = Prometheus(tmp_path / "prometheus", config=scrape(agent, handler_address))
        try:
            # rate() needs a sample before the execs it shows, and the agent exports the
            # counter from the first emulated exec on: one exec first, then the counted ones.
            prometheus.wait_until("execwatch_node_binfmt_emulators", bool)
            assert binfmt_namespace.run(busybox_arm64, "true").returncode == 0
            prometheus.wait_until("execwatch_kernel_emulated_execs_total", bool)
            for _ in range(EMULATED_RUNS):
                ran = binfmt_namespace.run(busybox_arm64, "true")
                assert ran.returncode == 0, ran.stderr
            answers = emulation_answers(prometheus)
        finally:
            prometheus.stop()

    by_node, nodes, workloads, failed = answers
    assert [(s["node"], s["emulated_arch"]) for s in by_node] == [("node-a", "arm64")]
    assert [(s["node"], s["emulated_arch"], s["flags"]) for s in nodes] == [
        ("node-a", "arm64", "F")
    ]
    assert [(s["workload"], s["binary_arch"], s["node"]) for s in workloads] == [
        ("web", "arm64", "node-a")
    ]
    assert failed == [0.0], "an emulated exec is no failed exec"


@contextmanager
def serving(registry: CollectorRegistry) -> Iterator[str]:
    server = serve(("127.0.0.1", 0), registry)
    try:
        yield f"127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()


def scrape(agent: str, handler: str) -> dict[str, Any]:
    static = {"targets": [agent], "labels": {"node": "node-a"}}
    return {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {"job_name": "execwatch-agent", "static_configs": [static]},
            {"job_name": "execwatch-handler", "static_configs": [{"targets": [handler]}]},
        ],
    }


Answers = tuple[list[dict[str, str]], list[dict[str, str]], list[dict[str, str]], list[float]]


def emulation_answers(prometheus: Prometheus) -> Answers:
    """What the emulation panels and the failed-exec stat show once both targets are in."""
    [rate] = panel("Emulated execs by node and architecture")["targets"]
    [inventory] = panel("Nodes that emulate")["targets"]
    [workloads] = panel("Workloads running emulated binaries (range)")["targets"]
    [failed] = panel("Failed execs (range)")["targets"]
    prometheus.wait_until(grafana_expr(rate["expr"]), lambda v: v and v[0] > 0, timeout=60)
    prometheus.wait_until(grafana_expr(workloads["expr"]), lambda v: v == [EMULATED_RUNS])

    def series(expr: str) -> list[dict[str, str]]:
        return [s["metric"] for s in prometheus.query(grafana_expr(expr))["result"]]

    return (
        series(rate["expr"]),
        series(inventory["expr"]),
        series(workloads["expr"]),
        prometheus.values(grafana_expr(failed["expr"])),
    )
