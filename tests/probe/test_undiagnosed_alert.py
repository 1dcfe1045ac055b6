"""The shipped alert on Undiagnosed failures, evaluated by a real Prometheus scraping the
real node stack while failures on a hung FUSE mount go undiagnosed.

The rule waits 5 minutes before it fires; what is shown here is the real Prometheus
putting it in `pending` with each cause, from the metric as the node stack exports it.
The firing and silent cases, over time, are promtool's (tests/deploy/rules_test.yaml).
"""

from __future__ import annotations

import errno
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from execwatch.node.stack import StackOptions
from execwatch.pipeline import PipelineOptions
from execwatch.record import UndiagnosedCause
from execwatch.serving.exposition import serve
from execwatch.serving.http import BoundedServer
from tests.probe.conftest import Children
from tests.support.monitoring.prometheus_server import Prometheus
from tests.support.node.stack_runner import node_stack

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "prometheus" / "execwatch-rules.yaml"
NODE = "ci-node"


@pytest.fixture
def metrics() -> Iterator[BoundedServer]:
    """The node stack with its consume loop and its metrics on loopback, as the agent."""
    options = StackOptions(pipeline=PipelineOptions(window=0.05))
    with node_stack(options, loop="run") as running:
        server = serve(("127.0.0.1", 0), running.stack.registry)
        try:
            yield server
        finally:
            server.shutdown()


@pytest.fixture
def prometheus(metrics: BoundedServer, tmp_path: Path) -> Iterator[Prometheus]:
    target = f"127.0.0.1:{metrics.server_port}"
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [
            {
                "job_name": "execwatch-agent",
                "static_configs": [{"targets": [target], "labels": {"node": NODE}}],
            }
        ],
    }
    server = Prometheus(tmp_path / "prometheus", config=config)
    try:
        yield server
    finally:
        server.stop()


def test_undiagnosed_failures_put_the_alert_pending_with_their_causes(
    prometheus: Prometheus,
    children: Children,
    hung_mount: Path,
    hello_arm64: Path,
    tmp_path: Path,
) -> None:
    every_cause = f'execwatch_undiagnosed_total{{node="{NODE}"}}'
    scraped = prometheus.wait_until(every_cause, lambda got: len(got) == len(UndiagnosedCause))
    assert set(scraped) == {0.0}  # exported from the start: a first one is an increase()
    local = tmp_path / "arm64"
    shutil.copy(hello_arm64, local)
    assert children.exec(str(local), linger=0.5) == errno.ENOEXEC  # diagnosed
    for n in range(4):  # the first overruns its budget; the mount is then refused
        assert children.exec(str(hung_mount / f"app-{n}"), linger=0.5) == errno.ENOEXEC
        time.sleep(1.5)

    alert = 'ALERTS{alertname="ExecwatchUndiagnosedFailures"}'
    prometheus.wait_until(alert, lambda got: len(got) == 2, timeout=30)
    found = {
        (s["metric"]["cause"], s["metric"]["alertstate"], s["metric"]["node"])
        for s in prometheus.query(alert)["result"]
    }
    assert found == {("overran", "pending", NODE), ("slow_mount", "pending", NODE)}
    counted = f'sum(execwatch_undiagnosed_total{{node="{NODE}"}})'
    assert prometheus.values(counted) == [4.0]
