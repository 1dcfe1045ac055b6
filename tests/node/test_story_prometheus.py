"""The real Prometheus of the node scrapes the agent and the handlers through the chart's
Services (docs/install.md's kubernetes_sd configuration) and evaluates the shipped rules:
ExecwatchExecFailures fires for the workload test_story left crash-looping."""

from __future__ import annotations

from typing import Any

from tests.deploy.prometheus import Prometheus
from tests.node.install import Release
from tests.node.node import NODE_NAME, Node, wait_for
from tests.node.test_story import NS


def test_prometheus_scrapes_agent_and_handlers_through_the_charts_services(
    prometheus: Prometheus,
) -> None:
    prometheus.wait_until('sum(up{job="execwatch-agent"})', lambda v: v == [1.0], timeout=60)
    prometheus.wait_until('sum(up{job="execwatch-handler"})', lambda v: v == [2.0], timeout=60)
    (agent,) = prometheus.query('up{job="execwatch-agent"}')["result"]
    assert agent["metric"]["node"] == NODE_NAME
    # Exactly one handler leads.
    prometheus.wait_until("sum(execwatch_handler_leader)", lambda v: v == [1.0], timeout=60)


def test_the_shipped_alert_fires_for_the_crash_looping_workload(
    node: Node, release: Release, prometheus: Prometheus
) -> None:
    """ExecwatchExecFailures has no `for:`, so Prometheus moves it from pending to firing in
    one evaluation: the states seen are recorded, firing is what must come."""
    seen: list[str] = []
    prometheus.wait_until(
        f'sum(execwatch_exec_failures_total{{namespace="{NS}", workload="web"}})',
        lambda v: v and v[0] >= 1,
        timeout=60,
    )

    def firing() -> dict[str, Any] | None:
        for alert in prometheus.get("/api/v1/alerts")["alerts"]:
            labels = alert["labels"]
            if labels["alertname"] == "ExecwatchExecFailures" and labels.get("namespace") == NS:
                seen.append(alert["state"])
                if alert["state"] == "firing":
                    return dict(alert)
        return None

    alert = wait_for("ExecwatchExecFailures firing", firing, 60, every=0.5)
    labels = alert["labels"]
    assert (labels["workload"], labels["container"]) == ("web", "web")
    assert (labels["reason"], labels["binary_arch"], labels["node_arch"]) == (
        "ForeignArchitecture",
        "arm64",
        "amd64",
    )
    assert labels["severity"] == "warning"
    assert alert["annotations"]["runbook_url"].endswith("#foreignarchitecture")
