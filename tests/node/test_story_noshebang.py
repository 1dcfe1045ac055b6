"""On the real node: a release whose entrypoint has no `#!` line crash-loops (runc's init
gives up: `exec /app/run.sh: exec format error`); execwatch posts MissingShebang on the pod
and the real Prometheus fires the shipped alert. A healthy pod whose shell runs a script
without `#!` every few seconds (busybox runs it itself) stays silent: counted by the
agent, no Event, no label."""

from __future__ import annotations

import time
from typing import Any

from kubernetes import client

from tests.node.test_story import LABEL, agent_counter, side_pod
from tests.support.kubenode.helm_install import Release
from tests.support.kubenode.kubelet_node import Node, pod_ready, wait_for
from tests.support.kubenode.node_images import (
    NOSHEBANG_ENTRYPOINT,
    SIDE_NOSHEBANG,
    WEB_V2_NOSHEBANG,
)
from tests.support.kubenode.story_workloads import (
    container,
    deployment,
    ensure_namespace,
    handler_samples,
    pods,
    restarts,
    warning_events,
)
from tests.support.monitoring.prometheus_server import Prometheus

NS = "scripts"


def missing_shebang_events(node: Node, pod: str) -> list[Any]:
    return [e for e in warning_events(node, NS, pod) if e.reason == "MissingShebang"]


def test_an_entrypoint_without_shebang_crash_loops_and_execwatch_says_why(
    node: Node, release: Release
) -> None:
    ensure_namespace(node, NS)
    apps = client.AppsV1Api(node.client())
    apps.create_namespaced_deployment(NS, deployment("entry", NS, WEB_V2_NOSHEBANG))
    crashing = wait_for(
        "the entry pod restarted",
        lambda: next((p for p in pods(node, NS, "app=entry") if restarts(p) >= 1), None),
        120,
    )
    name = crashing.metadata.name

    (event, *_) = wait_for(
        "execwatch's MissingShebang Event", lambda: missing_shebang_events(node, name), 90
    )

    assert event.involved_object.uid == crashing.metadata.uid
    assert f'container "entry" could not exec {NOSHEBANG_ENTRYPOINT} (ENOEXEC)' in event.message
    assert 'no #! interpreter line (first bytes: "exec /bin/busybox httpd' in event.message
    assert "nothing retried it with a shell" in event.message
    wait_for(
        "the pod labelled MissingShebang",
        lambda: (
            node.core().read_namespaced_pod(name, NS).metadata.labels.get(LABEL) == "MissingShebang"
        ),
        15,
    )


def test_a_shell_running_a_script_without_shebang_stays_silent(
    node: Node, release: Release
) -> None:
    ensure_namespace(node, NS)
    pod = side_pod("plain", NS)
    pod.spec.containers = [container("main", SIDE_NOSHEBANG)]
    node.core().create_namespaced_pod(NS, pod)
    wait_for(
        "the plain pod Running",
        lambda: pod_ready(node.core().read_namespaced_pod("plain", NS)),
        60,
    )

    def counted() -> float:
        return sum(
            value
            for labels, value in handler_samples(node, "execwatch_exec_failures_total")
            if labels.get("namespace") == NS and labels.get("reason") == "NoShebang"
        )

    before = agent_counter(node, "execwatch_events_total", reason="NoShebang")
    time.sleep(10)  # three runs of the script, each an ENOEXEC its shell got past
    after = agent_counter(node, "execwatch_events_total", reason="NoShebang")

    running = node.core().read_namespaced_pod("plain", NS)
    assert pod_ready(running) and restarts(running) == 0
    assert warning_events(node, NS, "plain") == []
    assert LABEL not in (running.metadata.labels or {})
    assert after - before >= 2  # the agent saw them and judged them benign
    assert counted() == 0  # quiet: not published, so the handler never counts them


def test_the_shipped_alert_fires_for_the_entrypoint_without_shebang(
    node: Node, release: Release, prometheus: Prometheus
) -> None:
    def firing() -> dict[str, Any] | None:
        for alert in prometheus.get("/api/v1/alerts")["alerts"]:
            labels = alert["labels"]
            if (
                labels["alertname"] == "ExecwatchExecFailures"
                and labels.get("namespace") == NS
                and labels["reason"] == "MissingShebang"
                and alert["state"] == "firing"
            ):
                return dict(alert)
        return None

    alert = wait_for("ExecwatchExecFailures firing for MissingShebang", firing, 240, every=1)

    labels = alert["labels"]
    assert (labels["workload"], labels["container"], labels["severity"]) == (
        "entry",
        "entry",
        "warning",
    )
    assert alert["annotations"]["runbook_url"].endswith("#missingshebang")
