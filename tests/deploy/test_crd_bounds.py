"""The ExecFailure CRD's bounds are stated once, in execwatch.crd's tables: the yaml the
API server enforces says the same, and `crd.parse` refuses what the yaml refuses."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from execwatch import crd
from execwatch.record import AttributionStatus, Reason
from tests.support.deploy.chart import REPO

SCHEMA = REPO / "deploy" / "base" / "crd.yaml"  # the chart's and kustomize's are generated


def spec_schema() -> dict[str, Any]:
    doc = yaml.safe_load(SCHEMA.read_text())
    (version,) = doc["spec"]["versions"]
    spec: dict[str, Any] = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return spec


def fields(schema: dict[str, Any], prefix: str = "") -> dict[str, dict[str, Any]]:
    """Every leaf of `schema`'s properties by its dotted path."""
    out: dict[str, dict[str, Any]] = {}
    for name, sub in schema.get("properties", {}).items():
        if sub.get("type") == "object":
            out.update(fields(sub, f"{prefix}{name}."))
        else:
            out[f"{prefix}{name}"] = sub
    return out


def test_every_max_length_of_the_yaml_is_the_table_s() -> None:
    declared = {k: v["maxLength"] for k, v in fields(spec_schema()).items() if "maxLength" in v}
    assert declared == dict(crd.MAX_LENGTH)


def test_the_required_fields_and_the_number_ranges_are_the_table_s() -> None:
    spec = spec_schema()
    leaves = fields(spec)
    assert tuple(spec["required"]) == crd.REQUIRED
    assert (leaves["count"]["minimum"], leaves["count"]["maximum"]) == crd.COUNT
    assert (leaves["uid"]["minimum"], leaves["uid"]["maximum"]) == crd.UID
    for name in ("node", "nodeArch", "path"):  # required strings: never empty either
        assert leaves[name]["minLength"] == 1


def test_the_enums_are_the_vocabularies() -> None:
    leaves = fields(spec_schema())
    assert tuple(leaves["syscall"]["enum"]) == crd.SYSCALLS
    assert set(leaves["reason"]["enum"]) == {str(r) for r in Reason}
    assert set(leaves["attribution"]["enum"]) == {str(s) for s in AttributionStatus}


def valid() -> dict[str, Any]:
    return {
        "metadata": {"name": "n-1", "uid": "u-1"},
        "spec": {
            "node": "node-1",
            "nodeArch": "amd64",
            "errno": "ENOEXEC",
            "reason": "ForeignArchitecture",
            "path": "/app",
            "count": 1,
            "firstSeen": "2026-01-01T00:00:00Z",
            "lastSeen": "2026-01-01T00:00:01Z",
            "attribution": "attributed",
            "pod": {},
            "container": {},
            "workload": {},
        },
    }


def put(obj: dict[str, Any], dotted: str, value: object) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    *parents, key = dotted.split(".")
    node = out["spec"]
    for parent in parents:
        node = node[parent]
    node[key] = value
    return out


def test_a_valid_record_parses() -> None:
    assert crd.parse(valid()).node == "node-1"


# parse() reads every string of the table but these: the handler does not use them
UNREAD = {"parentComm", "container.runtime", "cgroup"}


@pytest.mark.parametrize("dotted", sorted(set(crd.MAX_LENGTH) - UNREAD))
def test_parse_takes_each_string_at_its_bound_and_refuses_one_longer(dotted: str) -> None:
    limit = crd.MAX_LENGTH[dotted]
    crd.parse(put(valid(), dotted, "A" * limit))
    with pytest.raises(crd.InvalidRecord) as err:
        crd.parse(put(valid(), dotted, "A" * (limit + 1)))
    assert err.value.kind == "oversized" and f"spec.{dotted} " in str(err.value)


@pytest.mark.parametrize("count", [crd.COUNT[0] - 1, crd.COUNT[1] + 1])
def test_parse_refuses_a_count_out_of_the_range(count: int) -> None:
    with pytest.raises(crd.InvalidRecord):
        crd.parse(put(valid(), "count", count))


def descriptions(node: object) -> set[str]:
    if isinstance(node, dict):
        found = {node["description"]} if isinstance(node.get("description"), str) else set()
        return found.union(*(descriptions(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(descriptions(v) for v in node))
    return set()


def test_no_description_is_cut_short_by_a_yaml_comment() -> None:
    """An unquoted ` #` starts a comment: `or #! interpreter` once lost its end."""
    text = SCHEMA.read_text()
    parsed = descriptions(yaml.safe_load(text))
    written = [
        line.split("description:", 1)[1].strip().strip('"')
        for line in text.splitlines()
        if line.strip().startswith("description:")
    ]
    assert written and all(line in parsed for line in written)
