"""The handler's feedback on the real API server: a platform-class failure the handler
counted in a namespace that opted in becomes a sighting in the verdict of the container's
image digest, on the node's architecture, scoped to the pod's namespace and owner;
nothing else does; a full queue drops and counts."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
from kubernetes import client

from execwatch.placement.observed import Feedback, FeedbackConfig
from execwatch.placement.verdicts import Sighting, VerdictStore
from execwatch.record import NOT_ALERTED, PLATFORM_REASONS, Reason
from tests.placement.cluster import namespace, rest_for
from tests.placement.observedpods import record_of, running_pod
from tests.placement.test_verdicts import crd, store
from tests.support.wait import wait_until

__all__ = ["crd", "store"]

D = "sha256:" + "cd" * 32
IMAGE_ID = f"registry.example/team/app@{D}"


@pytest.fixture
def feedback(admin: client.ApiClient) -> Iterator[Feedback]:
    fb = Feedback(rest_for(admin))
    fb.start()
    yield fb
    fb.stop()


def sample(fb: Feedback, name: str, **labels: str) -> float:
    return fb.registry.get_sample_value(name, labels) or 0.0


def test_the_platform_class_is_the_four_reasons_and_each_is_alerted() -> None:
    assert {str(r) for r in PLATFORM_REASONS} == {
        "ForeignArchitecture", "MissingInterpreter", "LibcMismatch", "UnsupportedCPU",
    }  # fmt: skip
    assert not PLATFORM_REASONS & NOT_ALERTED


@pytest.mark.parametrize("mode", ["enforce", "mitigate"])
def test_a_foreign_architecture_failure_becomes_a_sighting_of_its_workload(
    store: VerdictStore, admin: client.ApiClient, feedback: Feedback, mode: str
) -> None:
    ns = namespace(admin, mode)
    pod = running_pod(admin, ns, IMAGE_ID)

    feedback.offer(record_of(pod, node_arch="arm64", count=2))
    wait_until(feedback.idle)

    got = store.get(D)
    assert got is not None and got.image == "registry.example/team/app:1"
    assert got.platforms == {}, "a sighting is no verdict of the image's"
    [seen] = got.observed
    assert seen == Sighting(
        "linux/arm64", ns, "ReplicaSet/app-7d9f8b6c5d", "/opt/tool", seen.time,
        "ForeignArchitecture: /opt/tool: an amd64 binary cannot run on this arm64 node", 2,
    )  # fmt: skip
    assert (
        sample(feedback, "execwatch_verdict_writes_total", source="observed", result="written") == 1
    )


@pytest.mark.parametrize("mode", [None, "warn", "off"])
def test_a_namespace_that_did_not_opt_in_feeds_nothing(
    store: VerdictStore, admin: client.ApiClient, feedback: Feedback, mode: str | None
) -> None:
    pod = running_pod(admin, namespace(admin, mode), IMAGE_ID)

    feedback.offer(record_of(pod, node_arch="arm64"))
    wait_until(feedback.idle)

    assert store.get(D) is None
    assert (
        sample(feedback, "execwatch_verdict_writes_total", source="observed", result="ignored") == 1
    )


@pytest.mark.parametrize(
    ("reason", "image_id", "node_arch"),
    [
        (Reason.MISSING_LIBRARY, IMAGE_ID, "arm64"),  # not platform-class
        (Reason.STARTUP_CRASH, IMAGE_ID, "arm64"),
        (Reason.FOREIGN_ARCHITECTURE, "", "arm64"),  # not pulled: no digest
        (Reason.FOREIGN_ARCHITECTURE, "sha256:" + "ee" * 32, "arm64"),  # a local image's ID
        (Reason.FOREIGN_ARCHITECTURE, IMAGE_ID, "unknown"),  # an architecture no image names
    ],
)
def test_other_failures_write_nothing(
    store: VerdictStore,
    admin: client.ApiClient,
    feedback: Feedback,
    reason: Reason,
    image_id: str,
    node_arch: str,
) -> None:
    pod = running_pod(admin, namespace(admin, "enforce"), image_id or "registry.example/team/app")
    if not image_id:
        core = client.CoreV1Api(admin)
        meta = pod["metadata"]
        body = {"status": {"containerStatuses": [{**pod["status"]["containerStatuses"][0],
                                                  "imageID": ""}]}}  # fmt: skip
        core.patch_namespaced_pod_status(meta["name"], meta["namespace"], body)

    feedback.offer(record_of(pod, reason=reason, node_arch=node_arch))
    wait_until(feedback.idle)

    assert store.get(D) is None and store.get("sha256:" + "ee" * 32) is None


def test_a_record_of_a_pod_replaced_under_its_name_writes_nothing(
    store: VerdictStore, admin: client.ApiClient, feedback: Feedback
) -> None:
    pod = running_pod(admin, namespace(admin, "enforce"), IMAGE_ID)
    rec = dataclasses.replace(record_of(pod), pod_uid="6f1c0a52-0000-4000-8000-000000000000")

    feedback.offer(rec)
    wait_until(feedback.idle)

    assert store.get(D) is None


def test_a_full_queue_drops_and_counts_without_waiting(
    store: VerdictStore, admin: client.ApiClient
) -> None:
    pod = running_pod(admin, namespace(admin, "enforce"), IMAGE_ID)
    fb = Feedback(rest_for(admin), FeedbackConfig(queue=1))  # not started: nothing is taken off

    for _ in range(3):
        fb.offer(record_of(pod))

    assert sample(fb, "execwatch_verdict_writes_total", source="observed", result="dropped") == 2
    fb.start()
    wait_until(fb.idle)
    fb.stop()
    got = store.get(D)
    assert got is not None and [s.platform for s in got.observed] == ["linux/arm64"]
