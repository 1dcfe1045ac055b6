"""The controller's decision, written to the real API server: what the scheduler will see.

Pods are gated by the real webhook (test_webhook's fixtures). The verdicts come from a
scripted source here: judging images for real is tested with the registry."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from kubernetes import client

from execwatch.placement.affinity import ARCH_LABEL, NO_ARCH_LABEL
from execwatch.placement.controller import Placer, VerdictUnavailable
from execwatch.placement.decision import ContainerVerdict
from execwatch.placement.webhook import GATE, GATED_LABEL
from execwatch.runnable.verdict import Outcome
from tests.placement.cluster import create_pod, gates, namespace, rest_for

R, F = Outcome.RUNS, Outcome.FAILS


@dataclass
class Scripted:
    """Verdicts per image; an image named in `down` raises as an unreachable registry."""

    by_image: dict[str, tuple[Outcome, Outcome]] = field(default_factory=dict)
    down: set[str] = field(default_factory=set)

    def judge(
        self, pod: Mapping[str, Any], container: Mapping[str, Any], deadline: float
    ) -> ContainerVerdict:
        image = str(container["image"])
        if image in self.down:
            raise VerdictUnavailable(f"registry r.example: connection refused ({image})")
        amd64, arm64 = self.by_image.get(image, (Outcome.UNKNOWN, Outcome.UNKNOWN))
        why = {"arm64": "/app/server is x86-64", "amd64": "/app/server is arm64"}
        return ContainerVerdict(container["name"], image, {"amd64": amd64, "arm64": arm64}, why)


@dataclass
class Seen:
    decisions: list[str] = field(default_factory=list)
    fail_open: list[str] = field(default_factory=list)

    def decided(self, action: str, seconds: float) -> None:
        self.decisions.append(action)

    def failed_open(self, cause: str) -> None:
        self.fail_open.append(cause)


@pytest.fixture
def placer(admin: client.ApiClient) -> Iterator[tuple[Placer, Scripted, Seen]]:
    source, seen = Scripted(), Seen()
    yield Placer(rest_for(admin), source, lambda: ("amd64", "arm64"), seen), source, seen


def stored(api: client.ApiClient, pod: dict[str, Any]) -> dict[str, Any]:
    meta = pod["metadata"]
    got = client.CoreV1Api(api).read_namespaced_pod(meta["name"], meta["namespace"])
    result: dict[str, Any] = api.sanitize_for_serialization(got)
    return result


def required_terms(pod: dict[str, Any]) -> list[dict[str, Any]]:
    node = (pod["spec"].get("affinity") or {}).get("nodeAffinity") or {}
    required = node.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms: list[dict[str, Any]] = required.get("nodeSelectorTerms") or []
    return terms


def events(api: client.ApiClient, pod: dict[str, Any]) -> list[tuple[str, str, str]]:
    meta = pod["metadata"]
    listed = client.EventsV1Api(api).list_namespaced_event(
        meta["namespace"], field_selector=f"regarding.uid={meta['uid']}"
    )
    return [(e.type, e.reason, e.note) for e in listed.items]


def test_a_pod_whose_image_fails_on_arm64_is_placed_on_amd64_and_ungated(
    registered: object, admin: client.ApiClient, placer: tuple[Placer, Scripted, Seen]
) -> None:
    p, source, seen = placer
    source.by_image["r.example/app:1"] = (R, F)
    pod = create_pod(admin, namespace(admin, "enforce"), metadata={"labels": {"app": "web"}})
    assert gates(pod) == [GATE]

    outcome = p.handle(pod)

    now = stored(admin, pod)
    assert outcome is not None and outcome.action == "place"
    assert gates(now) == []
    assert now["metadata"]["labels"] == {"app": "web"}
    assert required_terms(now) == [
        {"matchExpressions": [{"key": ARCH_LABEL, "operator": "In", "values": ["amd64"]}]}
    ]
    [(kind, reason, note)] = events(admin, now)
    assert (kind, reason) == ("Normal", "Placed")
    assert note.startswith("placed on amd64 only: arm64: container 'app' (r.example/app:1)")
    assert seen.decisions == ["place"]


def test_the_api_server_accepts_the_requirement_on_every_ored_term(
    registered: object, admin: client.ApiClient, placer: tuple[Placer, Scripted, Seen]
) -> None:
    p, source, _ = placer
    source.by_image["r.example/app:1"] = (R, F)
    zone = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}
    host = {"key": "kubernetes.io/hostname", "operator": "Exists"}
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [zone]}, {"matchExpressions": [host]}]
            }
        }
    }
    pod = create_pod(admin, namespace(admin, "enforce"), affinity=affinity)

    p.handle(pod)

    arch = {"key": ARCH_LABEL, "operator": "In", "values": ["amd64"]}
    assert required_terms(stored(admin, pod)) == [
        {"matchExpressions": [zone, arch]},
        {"matchExpressions": [host, arch]},
    ]  # fmt: skip


def test_no_architecture_runs_keeps_the_pod_unschedulable_with_a_warning(
    registered: object, admin: client.ApiClient, placer: tuple[Placer, Scripted, Seen]
) -> None:
    p, source, _ = placer
    source.by_image.update({"r.example/app:1": (R, F), "r.example/init:1": (F, R)})
    init = [{"name": "init", "image": "r.example/init:1"}]
    pod = create_pod(admin, namespace(admin, "enforce"), initContainers=init)

    p.handle(pod)

    now = stored(admin, pod)
    assert gates(now) == []
    assert required_terms(now) == [
        {"matchExpressions": [{"key": NO_ARCH_LABEL, "operator": "Exists"}]}
    ]
    [(kind, reason, note)] = events(admin, now)
    assert (kind, reason) == ("Warning", "NoArchitectureRuns")
    assert "amd64: container 'init'" in note and "arm64: container 'app'" in note


def test_a_pinned_failing_architecture_is_left_alone_with_a_warning(
    registered: object, admin: client.ApiClient, placer: tuple[Placer, Scripted, Seen]
) -> None:
    p, source, _ = placer
    source.by_image["r.example/app:1"] = (R, F)
    pod = create_pod(admin, namespace(admin, "enforce"), nodeSelector={ARCH_LABEL: "arm64"})

    p.handle(pod)

    now = stored(admin, pod)
    assert (gates(now), now["spec"].get("affinity")) == ([], None)
    assert now["spec"]["nodeSelector"] == {ARCH_LABEL: "arm64"}
    [(kind, reason, note)] = events(admin, now)
    assert (kind, reason) == ("Warning", "PlacementUnchanged")
    assert "fails on arm64" in note


def test_a_registry_error_ungates_the_pod_unchanged_and_says_why(
    registered: object, admin: client.ApiClient, placer: tuple[Placer, Scripted, Seen]
) -> None:
    p, source, seen = placer
    source.down.add("r.example/app:1")
    pod = create_pod(admin, namespace(admin, "enforce"))

    outcome = p.handle(pod)

    now = stored(admin, pod)
    assert outcome is not None and outcome.action == "fail-open"
    assert (gates(now), now["spec"].get("affinity")) == ([], None)
    assert GATED_LABEL not in (now["metadata"].get("labels") or {})
    [(kind, reason, note)] = events(admin, now)
    assert (kind, reason) == ("Warning", "PlacementSkipped")
    assert (
        note == "placed without a verdict: registry r.example: connection refused (r.example/app:1)"
    )
    assert seen.fail_open == ["registry r.example"]


def test_past_its_budget_a_pod_is_ungated_without_asking_for_verdicts(
    registered: object, admin: client.ApiClient, placer: tuple[Placer, Scripted, Seen]
) -> None:
    p, source, _ = placer
    p.budget = 0.0
    source.by_image["r.example/app:1"] = (R, F)
    pod = create_pod(admin, namespace(admin, "enforce"))
    time.sleep(1.1)  # creationTimestamp has a one-second resolution

    outcome = p.handle(pod)

    assert outcome is not None and outcome.action == "fail-open"
    assert "no verdict within 0 s" in outcome.message
    assert gates(stored(admin, pod)) == []


def test_a_pod_without_the_gate_is_not_touched(
    registered: object, admin: client.ApiClient, placer: tuple[Placer, Scripted, Seen]
) -> None:
    p, _, seen = placer
    pod = create_pod(admin, namespace(admin, None))
    assert p.handle(pod) is None
    assert events(admin, pod) == [] and seen.decisions == []
