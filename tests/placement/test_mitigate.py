"""Mitigation on the real API server: a pod that keeps failing on its node's architecture
in a mitigate namespace is evicted through the Eviction API, so PodDisruptionBudgets hold;
a bare pod never is.

There is no controller-manager here: the PodDisruptionBudget's status is written as its
disruption controller writes it, and the pods' owners are references only."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from execwatch.placement.mitigate import MitigateConfig
from execwatch.placement.observed import Feedback, FeedbackConfig
from execwatch.placement.verdicts import VerdictStore
from tests.placement.cluster import namespace, rest_for
from tests.placement.observedpods import record_of, running_pod
from tests.placement.test_controller import events
from tests.placement.test_verdicts import crd, store
from tests.support.wait import wait_until

__all__ = ["crd", "store"]

IMAGE_ID = "registry.example/team/app@sha256:" + "cd" * 32
FAST = MitigateConfig(failures=3, window=60.0, rate=1.0, retry_initial=0.5, retry_max=1.0)


@pytest.fixture
def feedback(admin: client.ApiClient, store: VerdictStore) -> Iterator[Feedback]:
    fb = Feedback(rest_for(admin), FeedbackConfig(mitigate=FAST))
    fb.start()
    yield fb
    fb.stop()


def evictions(fb: Feedback, result: str) -> float:
    value = fb.registry.get_sample_value("execwatch_placement_evictions_total", {"result": result})
    return value or 0.0


def evicted(api: client.ApiClient, pod: dict[str, Any]) -> bool:
    """Deleted (no kubelet ends it: it stays, terminating) or gone."""
    meta = pod["metadata"]
    try:
        now = client.CoreV1Api(api).read_namespaced_pod(meta["name"], meta["namespace"])
    except ApiException as exc:
        return bool(exc.status == 404)
    return now.metadata.deletion_timestamp is not None


def budget(api: client.ApiClient, ns: str, allowed: int) -> None:
    """A PodDisruptionBudget over the pods labelled app=app, its status as the disruption
    controller would write it: `allowed` disruptions."""
    policy = client.PolicyV1Api(api)
    policy.create_namespaced_pod_disruption_budget(ns, {
        "metadata": {"name": "app"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "app"}}},
    })  # fmt: skip
    allow(api, ns, allowed)


def allow(api: client.ApiClient, ns: str, allowed: int) -> None:
    status = {
        "observedGeneration": 1, "disruptionsAllowed": allowed, "currentHealthy": 1 + allowed,
        "desiredHealthy": 1, "expectedPods": 1 + allowed,
    }  # fmt: skip
    client.PolicyV1Api(api).patch_namespaced_pod_disruption_budget_status(
        "app", ns, {"status": status}
    )


def fail(fb: Feedback, pod: dict[str, Any], times: int) -> None:
    for _ in range(times):
        fb.offer(record_of(pod, node_arch="arm64"))
    wait_until(fb.idle)


def test_a_deployments_pod_that_keeps_failing_is_evicted_once(
    admin: client.ApiClient, feedback: Feedback
) -> None:
    ns = namespace(admin, "mitigate")
    budget(admin, ns, allowed=1)
    pod = running_pod(admin, ns, IMAGE_ID)

    fail(feedback, pod, 2)
    assert not evicted(admin, pod)  # two failures: below the threshold
    fail(feedback, pod, 1)

    assert wait_until(lambda: evicted(admin, pod))
    [(kind, reason, note)] = events(admin, pod)
    assert (kind, reason) == ("Warning", "PlacementMitigated")
    assert note.startswith("evicted: 3 failures (ForeignArchitecture) of container 'app' on arm64")
    fail(feedback, pod, 5)
    assert (evictions(feedback, "evicted"), evictions(feedback, "gone")) == (1, 0)


def test_a_bare_pod_is_never_evicted_it_gets_a_warning(
    admin: client.ApiClient, feedback: Feedback
) -> None:
    pod = running_pod(admin, namespace(admin, "mitigate"), IMAGE_ID, owner=None)

    fail(feedback, pod, 6)

    assert not evicted(admin, pod)
    [(kind, reason, note)] = events(admin, pod)
    assert (kind, reason) == ("Warning", "PlacementNotMitigated")
    assert note.startswith("not evicted, nothing would recreate this bare pod: 3 failures")
    assert evictions(feedback, "bare") == 1


@pytest.mark.parametrize(("mode", "owner"), [("enforce", "ReplicaSet"), ("mitigate", "DaemonSet")])
def test_outside_mitigate_namespaces_and_for_daemonset_pods_nothing_is_evicted(
    admin: client.ApiClient, feedback: Feedback, mode: str, owner: str
) -> None:
    pod = running_pod(admin, namespace(admin, mode), IMAGE_ID, owner=owner)

    fail(feedback, pod, 6)

    assert not evicted(admin, pod) and events(admin, pod) == []


def test_a_budget_that_forbids_it_is_counted_and_the_eviction_retried_later(
    admin: client.ApiClient, feedback: Feedback
) -> None:
    ns = namespace(admin, "mitigate")
    budget(admin, ns, allowed=0)
    pod = running_pod(admin, ns, IMAGE_ID)

    fail(feedback, pod, 3)
    wait_until(lambda: evictions(feedback, "refused") >= 2)  # refused, and retried
    assert not evicted(admin, pod)

    allow(admin, ns, 1)
    assert wait_until(lambda: evicted(admin, pod))
    assert evictions(feedback, "evicted") == 1 and feedback.mitigator.pending() == 0


def test_evictions_are_rate_limited_for_the_whole_cluster(
    admin: client.ApiClient, store: VerdictStore
) -> None:
    slow = MitigateConfig(failures=1, rate=0.001, burst=1)
    fb = Feedback(rest_for(admin), FeedbackConfig(mitigate=slow))
    fb.start()
    ns = namespace(admin, "mitigate")
    pods = [running_pod(admin, ns, IMAGE_ID) for _ in range(2)]

    for pod in pods:
        fail(fb, pod, 1)
    fb.stop()

    assert [evicted(admin, pod) for pod in pods] == [True, False]
    assert evictions(fb, "evicted") == 1 and fb.mitigator.pending() == 1
