"""A container that fails every 5 s for two minutes, on the real node: every failure is
diagnosed, none is Undiagnosed, however long since the last one on its file system.

Each try execs its own copy of an arm64 program in the container's writable layer, so
each is a record of its own (a repeating path would be folded into one for minutes by
the publisher), and the handler's count must reach the number of tries the pod logged."""

from __future__ import annotations

import time

from kubernetes import client

from tests.support.kubenode.helm_install import Release
from tests.support.kubenode.kubelet_node import Node, wait_for
from tests.support.kubenode.node_images import SIDE, SIDE_FOREIGN
from tests.support.kubenode.story_workloads import container, ensure_namespace, handler_samples

NS = "spaced"
POD = "every-five-seconds"
RUN_S = 120
LOOP = (
    "i=0; busybox mkdir -p /tmp; while true; do i=$((i+1)); busybox cp {foreign} /tmp/try-$i;"
    " /tmp/try-$i >/dev/null 2>&1; echo tried; sleep 5; done"
)


def failing_pod() -> client.V1Pod:
    command = ["/bin/sh", "-c", LOOP.format(foreign=SIDE_FOREIGN)]
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=POD, namespace=NS),
        spec=client.V1PodSpec(
            containers=[container("main", SIDE, command=command)],
            termination_grace_period_seconds=1,
        ),
    )


def tries_logged(core: client.CoreV1Api) -> int:
    """How many tries the pod has logged; 0 while its container is not started yet."""
    try:
        log: str | None = core.read_namespaced_pod_log(POD, NS)
    except client.ApiException:
        return 0
    return (log or "").count("tried")  # the client gives None for a log still empty


def counted_by_reason(node: Node) -> dict[str, float]:
    counts: dict[str, float] = {}
    for labels, value in handler_samples(node, "execwatch_exec_failures_total"):
        if labels.get("namespace") == NS:
            counts[labels["reason"]] = counts.get(labels["reason"], 0.0) + value
    return counts


def test_a_container_failing_every_five_seconds_has_every_failure_diagnosed(
    node: Node, release: Release
) -> None:
    ensure_namespace(node, NS)
    core = node.core()
    core.create_namespaced_pod(NS, failing_pod())
    wait_for("the pod's first try", lambda: tries_logged(core), 90)
    time.sleep(RUN_S)
    tries = tries_logged(core)
    core.delete_namespaced_pod(POD, NS, grace_period_seconds=0)
    assert tries >= RUN_S // 5 - 2, tries

    def all_counted() -> dict[str, float] | None:
        counts = counted_by_reason(node)
        return counts if sum(counts.values()) >= tries else None

    counts = wait_for(f"{tries} failures counted by the handler", all_counted, 90)
    assert counts == {"ForeignArchitecture": tries}
