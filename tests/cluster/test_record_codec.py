"""The handler re-validates what it reads: records may come from an agent that is not
ours or predate a schema change. Pure functions, no API server."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from execwatch import crd
from execwatch.handler.pod_events import NOTE_LIMIT, note_for
from execwatch.kube.safe import fit_bytes, is_label_value, printable
from execwatch.text import safe_text
from tests.support.agent.exec_failures import exec_failure


def stored(**spec: Any) -> dict[str, Any]:
    doc = crd.to_body(
        exec_failure(pod_name="p", namespace="n", count=2),
        name="r1",
        namespace="execwatch",
        node="node-a",
        first_seen=10.0,
        last_seen=20.0,
        count=2,
    )
    doc["metadata"]["uid"] = "uid-1"
    doc["spec"].update(spec)
    return doc


@pytest.mark.parametrize(
    ("change", "kind"),
    [
        ({"count": 0}, "malformed"),
        ({"count": True}, "malformed"),
        ({"count": "3"}, "malformed"),
        ({"reason": "Bogus"}, "malformed"),
        ({"attribution": "maybe"}, "malformed"),
        ({"path": 42}, "malformed"),
        ({"path": ""}, "malformed"),
        ({"path": "/" * 5000}, "oversized"),
        ({"node": "n" * 300}, "oversized"),
        ({"firstSeen": "2030-01-01T00:00:00Z"}, "malformed"),
        ({"lastSeen": "not a time"}, "malformed"),
        ({"pod": ["not", "an", "object"]}, "malformed"),
    ],
)
def test_bad_records_are_classified_not_trusted(change: dict[str, Any], kind: str) -> None:
    with pytest.raises(crd.InvalidRecord) as err:
        crd.parse(stored(**change))
    assert err.value.kind == kind


def test_a_record_without_metadata_or_spec_is_malformed() -> None:
    cases: list[dict[str, Any]] = [{}, {"metadata": {"name": "x"}}, {"spec": {}}]
    for broken in cases:
        with pytest.raises(crd.InvalidRecord):
            crd.parse(copy.deepcopy(broken))


def test_the_agent_escapes_hostile_strings_before_they_leave_the_node() -> None:
    body = crd.to_body(
        exec_failure(path="/tmp/a\nb\x1b[2J\udcff\u202ec", comm="x\ty"),
        name="r",
        namespace="execwatch",
        node="n",
        first_seen=1.0,
        last_seen=1.0,
        count=1,
    )
    assert body["spec"]["path"] == "/tmp/a\\x0ab\\x1b[2J\\xff\\u202ec"
    assert body["spec"]["comm"] == "x\\x09y"


def test_cleaning_twice_does_not_double_the_escapes() -> None:
    once = safe_text("a\nb\\c")
    assert printable(once) == once == "a\\x0ab\\\\c"


def test_event_notes_fit_the_api_limit_in_bytes() -> None:
    rec = crd.parse(stored(path="/" + "é" * 2000, detail="ü" * 900))
    note = note_for(rec)
    assert len(note.encode()) <= NOTE_LIMIT
    assert fit_bytes("abc", 10) == "abc"


def test_another_os_binary_is_named_by_its_detail_not_as_an_architecture() -> None:
    detail = "a macOS arm64 executable (Mach-O): built with GOOS=darwin?"
    rec = crd.parse(stored(reason="ForeignOS", path="/app/server", binary_arch="arm64",
                           node_arch="amd64", interpreter=None, detail=detail))  # fmt: skip
    note = note_for(rec)
    assert "could not exec /app/server (ENOEXEC): on a amd64 node; node node-a; " in note
    assert note.endswith(f"; {detail}") and "arm64 binary" not in note


def test_label_values_are_checked() -> None:
    assert is_label_value("ExecFormatError")
    assert not is_label_value("a\nb") and not is_label_value("x" * 64)


def test_the_pod_label_on_the_metric_is_optional_and_guarded() -> None:
    from execwatch.handler.metrics import HandlerMetrics

    labels = {
        "namespace": "n",
        "workload": "w",
        "container": "c",
        "node": "a",
        "node_arch": "amd64",
        "binary_arch": "arm64",
        "reason": "ForeignArchitecture",
    }
    plain = HandlerMetrics()
    plain.count_failures({**labels, "pod": "p-1"}, 2)
    assert plain.registry.get_sample_value("execwatch_exec_failures_total", labels) == 2
    with_pod = HandlerMetrics(with_pod_label=True, max_series=1)
    with_pod.count_failures({**labels, "pod": "p-1"}, 1)
    with_pod.count_failures({**labels, "pod": "p-2"}, 1)
    get = with_pod.registry.get_sample_value
    assert get("execwatch_exec_failures_total", {**labels, "pod": "p-1"}) == 1
    other = {
        **labels,
        "namespace": "_other",
        "workload": "_other",
        "container": "_other",
        "node": "_other",
        "pod": "_other",
    }
    assert get("execwatch_exec_failures_total", other) == 1
    assert get("execwatch_handler_series_overflow_total", {}) == 1
