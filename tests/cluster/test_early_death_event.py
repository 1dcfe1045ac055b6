"""End to end on this host, for every early-death case of tests/support/probe/deaths.py: a side
process that dies right after its exec inside a runc container of a Pod in the real API
server ends in one Warning Event with its reason, the pod label and the metric; the
quiet cases (StartupCrash without the flag, benign exits) end in nothing.

The same path as tests/cluster/test_end_to_end.py (probe, diagnosis, attribution with the
agent's pod watch, publisher, handler), with early deaths instead of a failed exec. A
quiet case is followed by a marker, a failed exec of a foreign binary in the same
container: once its Event is there, an Event for the case would have been too.
"""

from __future__ import annotations

import secrets
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from execwatch.handler.controller import Handler
from execwatch.handler.pod_events import event_reason
from tests.cluster.conftest import NODE, PodFactory, label_of
from tests.cluster.test_end_to_end import pod_reader_rbac, running_agent
from tests.cluster.test_handler import events_of, failures_total
from tests.support.probe.deaths import DEATHS, KEEPALIVE, MARKER, Death
from tests.support.runtime.runc import KubeletCgroup, Runc, remove_pod_cgroups
from tests.support.wait import wait_until

__all__ = ["pod_reader_rbac"]


@pytest.mark.parametrize("death", DEATHS, ids=lambda d: d.name)
def test_an_early_death_in_a_container_ends_in_an_event_with_its_reason(
    death: Death,
    admin: client.ApiClient,
    agent_rest: Any,
    make_pod: PodFactory,
    namespace: str,
    start_handler: Callable[..., Handler],
    runc: Runc,
    pod_reader_rbac: None,
    tmp_path: Path,
) -> None:
    root = death.container_root(tmp_path / "root")
    container_id = secrets.token_hex(32)
    pod = make_pod(container_ids={"app": container_id})
    cgroup = KubeletCgroup("systemd", "besteffort", pod["metadata"]["uid"], container_id)
    handler = start_handler()
    try:
        with running_agent(agent_rest):
            name = runc.start_detached(cgroup, KEEPALIVE, rootfs=root)
            assert runc.exec(name, list(death.argv)) == death.exit_status
            if not death.shown:
                assert runc.exec(name, [MARKER]) != 0  # exec format error
            wait_until(lambda: events_of(admin, namespace), timeout=15)
            wait_until(handler.idle)
    finally:
        runc.cleanup()
        remove_pod_cgroups(cgroup.pod_path)

    [event] = events_of(admin, namespace)
    assert event.type == "Warning" and event.regarding.uid == pod["metadata"]["uid"]
    if not death.shown:
        assert (event.reason, label_of(admin, pod)) == ("ExecFormatError", "ExecFormatError")
        assert MARKER in event.note
        return
    assert death.reason is not None
    reason = event_reason(death.reason)
    assert (event.reason, label_of(admin, pod)) == (reason, reason)
    assert f"could not exec {death.path} ({event_status(death)})" in event.note
    assert all(value in event.note for value in death.details.values()), event.note
    labels = {"namespace": namespace, "workload": "app", "container": "app", "node": NODE}
    assert failures_total(handler, **labels, reason=str(death.reason)) == 1


def event_status(death: Death) -> str:
    """How the Event names the way it died: EXIT127, SIGSEGV."""
    if death.signal is not None:
        return signal.Signals(death.signal).name
    return f"EXIT{death.exit_code}"
