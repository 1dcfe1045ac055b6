"""Which architectures a pod template may land on: the NodeAffinity rules for kubernetes.io/arch."""

from __future__ import annotations

from typing import Any

import pytest

from execwatch.audit.scheduling import allowed_architectures

ALL = {"amd64", "arm64", "s390x"}


def required(*terms: list[dict[str, Any]]) -> dict[str, Any]:
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": t} for t in terms]}}}}  # fmt: skip


def arch(op: str, *values: str) -> dict[str, Any]:
    return {"key": "kubernetes.io/arch", "operator": op, "values": list(values)}


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({}, ALL),
        ({"nodeSelector": {"kubernetes.io/arch": "arm64"}}, {"arm64"}),
        ({"nodeSelector": {"beta.kubernetes.io/arch": "amd64"}}, {"amd64"}),
        ({"nodeSelector": {"disktype": "ssd"}}, ALL),
        (required([arch("In", "arm64", "amd64")]), {"arm64", "amd64"}),
        (required([arch("NotIn", "arm64")]), {"amd64", "s390x"}),
        (required([arch("In", "arm64")], [arch("In", "s390x")]), {"arm64", "s390x"}),  # ORed
        (required([arch("In", "arm64", "amd64"), arch("NotIn", "amd64")]), {"arm64"}),  # ANDed
        (required([{"key": "zone", "operator": "In", "values": ["a"]}]), ALL),
        (required([arch("DoesNotExist")]), set()),
        ({"nodeSelector": {"kubernetes.io/arch": "amd64"}, **required([arch("In", "arm64")])},
         set()),
    ],
)  # fmt: skip
def test_allowed_architectures(spec: dict[str, Any], expected: set[str]) -> None:
    assert allowed_architectures(spec, ALL) == expected
