"""An exec that a binfmt_misc emulator ran (Emulated) ends in a Warning Event that says what
ran it, one series per pod and binary, the pod label `Emulated` and the metric: against a
real API server, records published with the agent's credentials, the diagnosis made by the
node's own code (diagnoser.emulated) from the kernel event's fields."""

from __future__ import annotations

import dataclasses
from typing import Any

from kubernetes import client

from execwatch.diagnosis.diagnoser import emulated
from execwatch.handler.controller import Handler
from execwatch.record import Emulated, ExecFailure, Reason
from tests.cluster.conftest import NODE, Deliver, label_of
from tests.cluster.test_handler import (
    events_of,
    failures_total,
)
from tests.support.agent.exec_failures import exec_failure

QEMU = "/usr/bin/qemu-aarch64-static"
WORDS = f"an arm64 binary ran under {QEMU} on this amd64 node"


def emulated_exec(pod: dict[str, object], path: str, count: int) -> ExecFailure:
    """What the agent publishes for `path` run by QEMU: errno 0, the emulator's fields."""
    failure = exec_failure(pod=pod, path=path, err=0, count=count, comm="server")
    e = failure.event
    event = Emulated(
        time=e.time,
        pid=e.pid,
        tgid=e.tgid,
        ppid=e.ppid,
        uid=e.uid,
        comm=e.comm,
        parent_comm=e.parent_comm,
        path=e.path,
        cgroup_id=e.cgroup_id,
        mntns=e.mntns,
        emulator=QEMU,
        emulated_arch="arm64",
    )
    return dataclasses.replace(failure, event=event, diagnosis=emulated(event, "amd64"))


def test_an_emulated_exec_is_a_warning_event_per_pod_and_binary_and_a_label(
    admin: client.ApiClient,
    pod: dict[str, Any],
    handler: Handler,
    deliver: Deliver,
    namespace: str,
) -> None:
    for path, count in (("/app/server", 2), ("/app/server", 3), ("/app/worker", 1)):
        deliver(handler, emulated_exec(pod, path, count))

    events = events_of(admin, namespace)
    assert len(events) == 2, "one series per binary"
    [server] = [e for e in events if "ran /app/server:" in e.note]
    [worker] = [e for e in events if "ran /app/worker:" in e.note]
    assert (server.type, server.reason, server.action) == ("Warning", "Emulated", "Exec")
    assert server.series.count == 5
    assert server.regarding.uid == pod["metadata"]["uid"]
    assert (
        server.note == f'container "app" ran /app/server: {WORDS} (binfmt_misc emulation:'
        " slow, and it would fail with exec format error elsewhere); node " + NODE
    )
    assert "could not exec" not in server.note
    assert worker.series is None  # count 1: no series yet
    assert label_of(admin, pod) == "Emulated"
    labels = {"namespace": namespace, "node": NODE, "binary_arch": "arm64"}
    assert failures_total(handler, **labels, reason=str(Reason.EMULATED)) == 6


def test_an_emulated_exec_and_a_failed_one_of_the_same_binary_are_two_series(
    admin: client.ApiClient,
    pod: dict[str, Any],
    handler: Handler,
    deliver: Deliver,
    namespace: str,
) -> None:
    """The same file on the same pod: ENOEXEC before the emulator was registered, run by
    it after. Two Events, each with its own reason and words."""
    deliver(handler, exec_failure(pod=pod, path="/app/server"))
    deliver(handler, emulated_exec(pod, "/app/server", 1))

    by_reason = {e.reason: e for e in events_of(admin, namespace)}
    assert sorted(by_reason) == ["Emulated", "ExecFormatError"]
    assert WORDS in by_reason["Emulated"].note
    assert "could not exec /app/server (ENOEXEC)" in by_reason["ExecFormatError"].note
