"""The second seed's story on a real node: a release whose new image has an arm64 entrypoint
crash-loops; execwatch posts why on the pod, labels it, counts it; Prometheus scrapes both
components through the chart's Services and the shipped alert fires. And the first seed's
quieter case: a healthy pod whose side process keeps failing to exec a foreign binary."""

from __future__ import annotations

import time

from kubernetes import client

from tests.node.images import SIDE, SIDE_FOREIGN, WEB_V1, WEB_V2_ARM64
from tests.node.install import Release
from tests.node.node import NODE_NAME, Node, pod_ready, wait_for
from tests.node.workloads import (
    container,
    deployment,
    ensure_namespace,
    handler_samples,
    http_get,
    pods,
    restarts,
    warning_events,
)

NS = "shop"
LABEL = "execwatch.io/exec-failure"


def test_an_arm64_entrypoint_crash_loops_and_execwatch_says_why(
    node: Node, release: Release
) -> None:
    ensure_namespace(node, NS)
    apps = client.AppsV1Api(node.client())
    apps.create_namespaced_deployment(NS, deployment("web", NS, WEB_V1))
    (v1,) = wait_for(
        "web v1 Ready", lambda: [p for p in pods(node, NS, "app=web") if pod_ready(p)], 90
    )
    assert http_get(v1) == "v1"

    apps.patch_namespaced_deployment(
        "web",
        NS,
        {"spec": {"template": {"spec": {"containers": [{"name": "web", "image": WEB_V2_ARM64}]}}}},
    )
    new = wait_for(
        "the v2 pod restarted",
        lambda: next(
            (
                p
                for p in pods(node, NS, "app=web")
                if p.spec.containers[0].image == WEB_V2_ARM64 and restarts(p) >= 1
            ),
            None,
        ),
        120,
    )
    name = new.metadata.name
    events = wait_for(
        "execwatch's ExecFormatError Event",
        lambda: [e for e in warning_events(node, NS, name) if e.reason == "ExecFormatError"],
        60,
    )
    (event,) = events
    assert event.involved_object.field_path == "spec.containers{web}"
    assert event.involved_object.uid == new.metadata.uid
    assert 'container "web" could not exec /bin/server (ENOEXEC)' in event.message
    assert "a arm64 binary on a amd64 node" in event.message

    labelled = node.core().read_namespaced_pod(name, NS)
    assert labelled.metadata.labels[LABEL] == "ExecFormatError"
    # What NOTES.txt tells users to run finds both.
    listed = node.core().list_event_for_all_namespaces(
        field_selector="type=Warning,reportingComponent=execwatch.io/handler"
    )
    assert name in {e.involved_object.name for e in listed.items}
    assert name in {p.metadata.name for p in pods(node, NS, LABEL)}

    # The leading handler counts it, with the labels the alert rules select on.
    def counted() -> list[dict[str, str]]:
        return [
            labels
            for labels, value in handler_samples(node, "execwatch_exec_failures_total")
            if labels.get("namespace") == NS and value >= 1
        ]

    (labels,) = wait_for("execwatch_exec_failures_total for web", counted, 60)
    assert labels == {
        "namespace": NS,
        "workload": "web",
        "container": "web",
        "node": NODE_NAME,
        "node_arch": "amd64",
        "binary_arch": "arm64",
        "reason": "ForeignArchitecture",
    }

    # The release's old pod keeps serving: the Deployment waits for the new pod to be Ready.
    old = node.core().read_namespaced_pod(v1.metadata.name, NS)
    assert pod_ready(old) and restarts(old) == 0
    assert http_get(old) == "v1"


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
