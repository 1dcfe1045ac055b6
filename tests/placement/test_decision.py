"""Where a gated pod may go: the pure rules, before any API server is involved."""

from __future__ import annotations

from typing import Any

import pytest

from execwatch.placement.affinity import ARCH_LABEL, NO_ARCH_LABEL, user_pin
from execwatch.placement.decision import Action, ContainerVerdict, decide
from execwatch.runnable.verdict import Outcome

CLUSTER = ("amd64", "arm64")
R, E, F, U = Outcome.RUNS, Outcome.EMULATED, Outcome.FAILS, Outcome.UNKNOWN


def verdict(amd64: Outcome, arm64: Outcome, name: str = "app") -> ContainerVerdict:
    why = {a: f"/app/server is x86-64 on {a}" for a, o in (("amd64", amd64), ("arm64", arm64))}
    return ContainerVerdict(name, f"r/{name}@sha256:ab", {"amd64": amd64, "arm64": arm64}, why)


def arch_expr(*values: str, op: str = "In") -> dict[str, Any]:
    return {"key": ARCH_LABEL, "operator": op, "values": list(values)}


def terms(spec: dict[str, Any], affinity: dict[str, Any] | None) -> list[dict[str, Any]]:
    assert affinity is not None
    required = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    result: list[dict[str, Any]] = required["nodeSelectorTerms"]
    return result


def test_an_image_that_fails_on_arm64_is_placed_on_amd64_only() -> None:
    spec: dict[str, Any] = {"containers": [{"name": "app"}]}

    d = decide(spec, [verdict(R, F)], CLUSTER)

    assert (d.action, d.arches, d.warning) == (Action.PLACE, ("amd64",), False)
    assert d.message.startswith("placed on amd64 only: arm64: container 'app'")
    assert terms(spec, d.affinity(spec)) == [{"matchExpressions": [arch_expr("amd64")]}]


def test_every_ored_term_gets_the_requirement_not_a_new_term() -> None:
    zone_a = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
    zone_b = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
    spec: dict[str, Any] = {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [zone_a, zone_b]
                },
                "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1}],
            },
            "podAntiAffinity": {"x": 1},
        }
    }

    affinity = decide(spec, [verdict(R, F)], CLUSTER).affinity(spec)

    got = terms(spec, affinity)
    assert len(got) == 2
    assert got[0]["matchExpressions"] == [*zone_a["matchExpressions"], arch_expr("amd64")]
    assert got[1]["matchFields"] == zone_b["matchFields"]
    assert got[1]["matchExpressions"] == [arch_expr("amd64")]
    assert affinity is not None and affinity["podAntiAffinity"] == {"x": 1}
    assert affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert (
        len(
            spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
                "nodeSelectorTerms"
            ][0]["matchExpressions"]
        )
        == 1
    ), "the input is not mutated"


def test_an_honest_image_is_left_alone() -> None:
    d = decide({}, [verdict(R, R), verdict(R, E, "sidecar")], CLUSTER)
    assert (d.action, d.affinity({})) == (Action.LEAVE, None)


def test_unknown_never_restricts() -> None:
    assert decide({}, [verdict(U, U)], CLUSTER).action is Action.LEAVE
    assert decide({}, [verdict(R, U), verdict(U, F, "b")], CLUSTER).arches == ("amd64",)


def test_no_architecture_works_keeps_the_pod_pending_with_a_reason() -> None:
    spec: dict[str, Any] = {}
    d = decide(spec, [verdict(R, F), verdict(F, R, "other")], CLUSTER)

    assert (d.action, d.warning) == (Action.NOWHERE, True)
    assert "amd64: container 'other'" in d.message and "arm64: container 'app'" in d.message
    assert terms(spec, d.affinity(spec)) == [
        {"matchExpressions": [{"key": NO_ARCH_LABEL, "operator": "Exists"}]}
    ]


@pytest.mark.parametrize(
    "spec",
    [
        {"nodeSelector": {ARCH_LABEL: "arm64"}},
        {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [arch_expr("arm64")]}]
                    }
                }
            }
        },
        {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [arch_expr("amd64", op="NotIn")]}
                        ]
                    }
                }
            }
        },
    ],
)
def test_a_user_who_pinned_a_failing_architecture_is_left_alone_with_a_warning(
    spec: dict[str, Any],
) -> None:
    d = decide(spec, [verdict(R, F)], CLUSTER)
    assert (d.action, d.warning, d.affinity(spec)) == (Action.LEAVE, True, None)
    assert "fails on arm64" in d.message


def test_a_pin_that_runs_is_left_alone_quietly() -> None:
    d = decide({"nodeSelector": {ARCH_LABEL: "amd64"}}, [verdict(R, F)], CLUSTER)
    assert (d.action, d.warning) == (Action.LEAVE, False)


def test_one_term_without_an_arch_expression_leaves_the_pod_unpinned() -> None:
    spec = {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [arch_expr("arm64")]},
                        {"matchExpressions": [{"key": "zone", "operator": "Exists"}]},
                    ]
                }
            }
        }
    }
    pin = user_pin(spec)
    assert not pin.pinned
    assert pin.allows("amd64") and pin.allows("arm64")
    assert decide(spec, [verdict(R, F)], CLUSTER).action is Action.PLACE


def test_binaries_the_pod_does_not_start_are_named_but_do_not_decide() -> None:
    helper = {"arm64": "/usr/bin/tool is x86-64"}
    app = ContainerVerdict("app", "r/app@sha256:ab", {"amd64": R, "arm64": R}, {}, helper)

    decision = decide({}, [app], CLUSTER)

    assert (decision.action, decision.warning) == (Action.LEAVE, False)
    assert decision.message == (
        "runs on every node architecture;"
        " not deciding: arm64: container 'app': /usr/bin/tool is x86-64"
    )


def test_what_fails_on_every_architecture_is_left_as_is_with_a_warning_naming_the_file() -> None:
    """No `#!` or another OS's binary: narrowing cannot help, holding would not either."""
    spec: dict[str, Any] = {"containers": [{"name": "app"}, {"name": "side"}]}
    why = "/app/run.sh: neither ELF nor a #! script: ...; no #! interpreter line"
    broken = ContainerVerdict("app", "r/app@sha256:ab", {"amd64": U, "arm64": U}, everywhere=why)

    d = decide(spec, [broken, verdict(R, F, name="side")], CLUSTER)

    assert (d.action, d.arches, d.warning) == (Action.LEAVE, (), True)
    assert d.affinity(spec) is None
    assert d.message == (
        f"fails on every node architecture, left as is: container 'app' (r/app@sha256:ab): {why}"
    )
