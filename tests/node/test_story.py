"""The second seed's story on a real node: a release whose new image has an arm64 entrypoint
crash-loops; execwatch posts why on the pod, labels it, counts it. The first seed's quieter
case: a healthy pod whose side process keeps failing to exec a foreign binary. And what a
fresh install meets first: a ResourceQuota that refuses records until the controller-manager
has counted it; nothing is lost meanwhile.

Prometheus and the alert: test_story_prometheus; Argo Rollouts: test_story_rollout."""

from __future__ import annotations

import time

from kubernetes import client

from tests.support.kubenode.helm_install import Release, agent_pod, quota_counted
from tests.support.kubenode.kubelet_node import NODE_NAME, QUOTA_RESYNC, Node, pod_ready, wait_for
from tests.support.kubenode.node_images import SIDE, SIDE_FOREIGN, WEB_V1, WEB_V2_ARM64
from tests.support.kubenode.story_workloads import (
    container,
    deployment,
    ensure_namespace,
    handler_samples,
    http_get,
    metric_samples,
    pods,
    restarts,
    warning_events,
)

NS = "shop"
SIDE_NS = "tools"
LABEL = "execwatch.io/exec-failure"


def agent_counter(node: Node, metric: str, **labels: str) -> float:
    """The sum of the agent's `metric` samples that carry `labels`."""
    return sum(
        value
        for got, value in metric_samples(agent_pod(node), metric)
        if labels.items() <= got.items()
    )


def side_pod(name: str, namespace: str) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, namespace=namespace),
        spec=client.V1PodSpec(
            containers=[container("main", SIDE)], termination_grace_period_seconds=1
        ),
    )


def exec_format_events(node: Node, namespace: str, pod: str) -> list[client.CoreV1Event]:
    return [e for e in warning_events(node, namespace, pod) if e.reason == "ExecFormatError"]


def test_records_refused_until_the_quota_is_counted_are_kept_not_lost(
    node: Node, release: Release
) -> None:
    """Right after install the chart's quota on count/execfailures has no usage: the
    controller-manager counts a new CRD's objects only at its next full resync, and until
    then the API server refuses every record ("status unknown for quota"). The agent keeps
    and retries those records; when the quota is counted they are created: the Event comes
    late, nothing is dropped."""
    core = node.core()
    assert not quota_counted(node), (
        f"the quota was counted already: nothing to prove (install took "
        f"{release.seconds_to_ready:.0f}s)"
    )
    ensure_namespace(node, "early")
    core.create_namespaced_pod("early", side_pod("early", "early"))
    wait_for(
        "the agent's create refused by the uncounted quota",
        lambda: agent_counter(node, "execwatch_publisher_api_errors_total", code="403") >= 1,
        90,
    )
    wait_for(
        "the Event of the refused record",
        lambda: exec_format_events(node, "early", "early"),
        QUOTA_RESYNC + 60,
        every=2,
    )
    assert quota_counted(node)
    # What the refusal used to cost: records dropped as refused for good. (The agent also
    # reports the host's own failed execs, other tests' included: the spool holds those.)
    assert agent_counter(node, "execwatch_publisher_dropped_total", type="rejected") == 0
    assert agent_counter(node, "execwatch_publisher_published_total") >= 1
    core.delete_namespaced_pod("early", "early", grace_period_seconds=0)


def test_a_healthy_pod_whose_side_process_fails_to_exec_is_reported_and_keeps_running(
    node: Node, release: Release
) -> None:
    ensure_namespace(node, SIDE_NS)
    core = node.core()
    core.create_namespaced_pod(SIDE_NS, side_pod("reporter", SIDE_NS))
    events = wait_for(
        "execwatch's Event for the side process",
        lambda: exec_format_events(node, SIDE_NS, "reporter"),
        60,
    )
    (event,) = events
    assert f"could not exec {SIDE_FOREIGN} (ENOEXEC)" in event.message
    time.sleep(7)  # two more failures of the side process
    running = core.read_namespaced_pod("reporter", SIDE_NS)
    assert running.status.phase == "Running" and pod_ready(running)
    assert restarts(running) == 0
    assert running.metadata.labels[LABEL] == "ExecFormatError"


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
    (event,) = wait_for(
        "execwatch's ExecFormatError Event", lambda: exec_format_events(node, NS, name), 60
    )
    assert event.involved_object.field_path == "spec.containers{web}"
    assert event.involved_object.uid == new.metadata.uid
    assert 'container "web" could not exec /bin/server (ENOEXEC)' in event.message
    assert "a arm64 binary on a amd64 node" in event.message

    # The handler labels the pod right after posting the Event (a second API call).
    wait_for(
        "the pod labelled ExecFormatError",
        lambda: (
            node.core().read_namespaced_pod(name, NS).metadata.labels.get(LABEL)
            == "ExecFormatError"
        ),
        15,
    )
    # What NOTES.txt tells users to run finds both.
    listed = node.core().list_event_for_all_namespaces(
        field_selector="type=Warning,reportingComponent=execwatch.io/handler"
    )
    assert name in {e.involved_object.name for e in listed.items}
    assert name in {p.metadata.name for p in pods(node, NS, LABEL)}

    # The leading handler counts it with the labels the alert rules select on. A container
    # that dies within milliseconds can be gone, rootfs and all, before the agent reads its
    # entrypoint (a loaded node): that failure is still counted, for the same container,
    # as Undiagnosed (docs/agent.md); no other series.
    def by_reason() -> dict[str, dict[str, str]]:
        return {
            labels["reason"]: labels
            for labels, value in handler_samples(node, "execwatch_exec_failures_total")
            if labels.get("namespace") == NS and value >= 1
        }

    def diagnosed() -> dict[str, dict[str, str]] | None:
        got = by_reason()
        return got if "ForeignArchitecture" in got else None

    series = wait_for("execwatch_exec_failures_total for web", diagnosed, 60)
    expected = {
        "namespace": NS,
        "workload": "web",
        "container": "web",
        "node": NODE_NAME,
        "node_arch": "amd64",
        "binary_arch": "arm64",
        "reason": "ForeignArchitecture",
    }
    assert series.pop("ForeignArchitecture") == expected
    assert series in ({}, {"Undiagnosed": expected | {"binary_arch": "", "reason": "Undiagnosed"}})

    # The release's old pod keeps serving: the Deployment waits for the new pod to be available.
    old = node.core().read_namespaced_pod(v1.metadata.name, NS)
    assert old.metadata.deletion_timestamp is None
    assert pod_ready(old) and restarts(old) == 0, old.status
    assert http_get(old) == "v1"
