"""docs/metrics.md, docs/crd.md and docs/privileges.md say what the code and manifests do."""

from __future__ import annotations

import re
from typing import Any, cast

import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

from execwatch.agent.metrics import PublisherMetrics
from execwatch.attribution.kube import PodWatchMetrics
from execwatch.handler.metrics import HandlerMetrics
from execwatch.node.metrics import NodeMetrics
from execwatch.placement.cli import PlacementMetrics
from execwatch.placement.expiry import VerdictExpiry
from execwatch.placement.mitigate import MitigateMetrics
from execwatch.placement.serving import webhook_drops
from execwatch.placement.verdicts import VerdictMetrics
from execwatch.record import Reason
from execwatch.serving.exposition import ServerMetrics
from execwatch.serving.metricsauth import AuthMetrics
from tests.deploy.test_dashboard import _Probe
from tests.support.deploy.chart import REPO, base_docs, find, pod_spec, render

DOCS = REPO / "docs"


def families() -> dict[str, tuple[str, set[str]]]:
    """name as exposed -> (type, label names), from the metric objects themselves."""
    registry = CollectorRegistry()
    owners: list[object] = [
        NodeMetrics(registry, _Probe()),
        PublisherMetrics(registry=registry),
        PodWatchMetrics(registry),
        HandlerMetrics(registry=registry),
        ServerMetrics(registry),
        AuthMetrics(registry),
        PlacementMetrics(registry),
        VerdictMetrics(registry=registry),
        MitigateMetrics(registry=registry),
        VerdictExpiry(rest=cast(Any, None), registry=registry),  # its counter, no API call
        webhook_drops(registry),
    ]
    for owner in owners:
        metrics = [owner] if isinstance(owner, MetricWrapperBase) else list(vars(owner).values())
        for metric in metrics:
            if isinstance(metric, MetricWrapperBase):
                show_labels(metric)
    out: dict[str, tuple[str, set[str]]] = {}
    for family in registry.collect():
        name = family.name + ("_total" if family.type == "counter" else "")
        labels = {k for s in family.samples for k in s.labels} - {"le"}
        out[name] = (family.type, labels)
    return out


def show_labels(metric: MetricWrapperBase) -> None:
    """Make a labelled metric export a sample, so that its label names show: a child with
    as many placeholder values as it has labels (public API only)."""
    for count in range(1, 10):
        try:
            metric.labels(*["placeholder"] * count)
            return
        except ValueError:
            continue


def table_rows(markdown: str) -> dict[str, list[str]]:
    rows = {}
    for line in markdown.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) >= 3:
            rows[cells[0].strip("`")] = cells
    return rows


def test_metrics_reference_lists_every_metric_with_its_type_and_labels() -> None:
    rows = table_rows((DOCS / "metrics.md").read_text())
    for name, (kind, labels) in families().items():
        assert name in rows, f"{name} missing from docs/metrics.md"
        assert rows[name][1] == kind, name
        documented = set(re.findall(r"`(\w+)`", rows[name][2]))
        assert labels - {"le"} <= documented | {"le"}, f"{name}: {labels - documented}"
    ours = {n for n in rows if n.startswith("execwatch_")}
    assert ours == set(families()), f"documented but not exported: {ours - set(families())}"


def _crd_fields(schema: dict[str, Any], prefix: str = "") -> set[str]:
    out = set()
    for key, sub in schema.get("properties", {}).items():
        path = f"{prefix}.{key}" if prefix else key
        out.add(path)
        out |= _crd_fields(sub, path)
    return out


def test_crd_reference_covers_every_spec_field() -> None:
    crd = find(base_docs(), "CustomResourceDefinition")
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    text = (DOCS / "crd.md").read_text()
    for field in _crd_fields(spec):
        assert f"`{field}`" in text, f"spec.{field} not in docs/crd.md"


def test_privileges_doc_explains_every_capability_and_every_rbac_verb() -> None:
    text = (DOCS / "privileges.md").read_text()
    docs = render("agent.podMetadata=runtime")
    caps = pod_spec(find(docs, "DaemonSet"))["containers"][0]["securityContext"]["capabilities"]
    for cap in caps["add"]:
        assert f"CAP_{cap}" in text, cap
    for doc in base_docs():
        if doc["kind"] in ("Role", "ClusterRole"):
            for rule in doc["rules"]:
                for res in rule["resources"]:
                    for verb in rule["verbs"]:
                        assert re.search(rf"`{res}`[^\n]*`{verb}`", text), (res, verb)
    for volume in ("/sys/kernel/tracing", "/sys/kernel/btf", "/sys/fs/cgroup", "hostPID"):
        assert volume in text


def test_install_doc_commands_use_real_values_and_paths() -> None:
    text = (DOCS / "install.md").read_text()
    values = yaml.safe_load((REPO / "charts/execwatch/values.yaml").read_text())
    for dotted in re.findall(r"--set ([\w.]+)=", text):
        node: Any = values
        for part in dotted.split("."):
            assert isinstance(node, dict), f"install.md: no value {dotted}"
            if node == {}:
                break  # a free-form map (labels, annotations)
            assert part in node, f"install.md: no value {dotted}"
            node = node[part]
    for path in re.findall(r"(deploy/[\w/.-]+|charts/[\w/.-]+)", text):
        assert (REPO / path.rstrip(".")).exists(), path


def test_reason_tables_list_every_reason() -> None:
    """docs/trace.md's reason table and docs/crd.md's enum name every Reason, and no other."""
    rows = table_rows((DOCS / "trace.md").read_text())
    assert {name for name in rows if name[:1].isupper()} == {str(r) for r in Reason}
    crd_doc = (DOCS / "crd.md").read_text()
    for reason in Reason:
        assert f"`{reason}`" in crd_doc, f"{reason} missing from docs/crd.md"
