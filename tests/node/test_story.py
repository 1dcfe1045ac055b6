"""The second seed's story on a real node: a release whose new image has an arm64 entrypoint
crash-loops; execwatch posts why on the pod, labels it, counts it; Prometheus scrapes both
components through the chart's Services and the shipped alert fires. And the first seed's
quieter case: a healthy pod whose side process keeps failing to exec a foreign binary."""

from __future__ import annotations

import time

from kubernetes import client

from tests.node.images import SIDE, SIDE_FOREIGN
from tests.node.install import Release
from tests.node.node import Node, pod_ready, wait_for
from tests.node.workloads import (
    container,
    ensure_namespace,
    restarts,
    warning_events,
)

NS = "shop"
LABEL = "execwatch.io/exec-failure"


def test_a_healthy_pod_whose_side_process_fails_to_exec_is_reported_and_keeps_running(
    node: Node, release: Release
) -> None:
    ensure_namespace(node, NS)
    core = node.core()
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name="reporter", namespace=NS),
        spec=client.V1PodSpec(containers=[container("main", SIDE)]),
    )
    core.create_namespaced_pod(NS, pod)
    events = wait_for(
        "execwatch's Event for the side process",
        lambda: [e for e in warning_events(node, NS, "reporter") if e.reason == "ExecFormatError"],
        60,
    )
    (event,) = events
    assert f"could not exec {SIDE_FOREIGN} (ENOEXEC)" in event.message
    time.sleep(7)  # two more failures of the side process
    running = core.read_namespaced_pod("reporter", NS)
    assert running.status.phase == "Running" and pod_ready(running)
    assert restarts(running) == 0
    assert running.metadata.labels[LABEL] == "ExecFormatError"
