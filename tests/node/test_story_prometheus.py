"""The real Prometheus of the node scrapes the agent and the handlers through the chart's
Services (docs/install.md's kubernetes_sd configuration) and evaluates the shipped rules:
ExecwatchExecFailures goes pending, then fires, for the workload test_story left
crash-looping."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import yaml

from tests.node.prometheus import RULES
from tests.node.test_story import NS
from tests.support.kubenode.helm_install import Release
from tests.support.kubenode.kubelet_node import NODE_NAME, Node, wait_for
from tests.support.monitoring.prometheus_server import Prometheus


def rule_for(alert: str) -> float:
    """The `for:` of `alert` in the shipped rules file, in seconds (it is in minutes)."""
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == alert:
                return float(rule["for"].removesuffix("m")) * 60
    raise AssertionError(f"{alert} not in {RULES}")


RULE_FOR = rule_for("ExecwatchExecFailures")


def test_prometheus_scrapes_agent_and_handlers_through_the_charts_services(
    prometheus: Prometheus,
) -> None:
    prometheus.wait_until('sum(up{job="execwatch-agent"})', lambda v: v == [1.0], timeout=60)
    prometheus.wait_until('sum(up{job="execwatch-handler"})', lambda v: v == [2.0], timeout=60)
    (agent,) = prometheus.query('up{job="execwatch-agent"}')["result"]
    assert agent["metric"]["node"] == NODE_NAME
    # Exactly one handler leads.
    prometheus.wait_until("sum(execwatch_handler_leader)", lambda v: v == [1.0], timeout=60)


def seconds_since(stamp: str) -> float:
    """Seconds since an RFC 3339 UTC time as Prometheus writes it (nanoseconds, Z)."""
    whole = stamp.removesuffix("Z").removesuffix("+00:00").partition(".")[0]
    at = datetime.strptime(whole, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC)
    return (datetime.now(UTC) - at).total_seconds()


def test_the_shipped_alert_goes_pending_then_fires_for_the_crash_looping_workload(
    node: Node, release: Release, prometheus: Prometheus
) -> None:
    """ExecwatchExecFailures holds for `for: 1m` (the rules file's own value; only the
    evaluation interval is the test's): pending first, firing a minute later."""
    prometheus.wait_until(
        f'sum(execwatch_exec_failures_total{{namespace="{NS}", workload="web"}})',
        lambda v: bool(v) and v[0] >= 1,
        timeout=60,
    )

    def state(wanted: str) -> dict[str, Any] | None:
        for alert in prometheus.get("/api/v1/alerts")["alerts"]:
            labels = alert["labels"]
            if (
                labels["alertname"] == "ExecwatchExecFailures"
                and labels.get("namespace") == NS
                and labels["reason"] == "ForeignArchitecture"
                and alert["state"] == wanted
            ):
                return dict(alert)
        return None

    already = state("firing")
    if already is None:
        pending = wait_for("ExecwatchExecFailures pending", lambda: state("pending"), 60)
        t0 = time.monotonic()
        alert = wait_for("ExecwatchExecFailures firing", lambda: state("firing"), 120)
        held = time.monotonic() - t0
        assert RULE_FOR - 5 <= held <= RULE_FOR + 30, held
        assert alert["activeAt"] == pending["activeAt"]
    else:  # the session's Prometheus, started by an earlier story, saw the loop long ago
        alert = already
        assert seconds_since(alert["activeAt"]) >= RULE_FOR, alert["activeAt"]
    labels = alert["labels"]
    assert (labels["workload"], labels["container"]) == ("web", "web")
    assert (labels["reason"], labels["binary_arch"], labels["node_arch"]) == (
        "ForeignArchitecture",
        "arm64",
        "amd64",
    )
    assert labels["severity"] == "warning"
    assert alert["annotations"]["runbook_url"].endswith("#foreignarchitecture")
