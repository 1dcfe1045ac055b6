"""The real agent process, the real probe and the real API server: an agent killed with
SIGKILL during a 60 s API server outage loses nothing, and publishes nothing twice.

Failures are caused for real (an arm64 busybox exec'd on this amd64 host: ENOEXEC),
under paths unique to the test, so failures other tests cause at the same time on this
machine (the probe sees the whole host) are told apart by path.
"""

from __future__ import annotations

import shutil
import signal
import sqlite3
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.cluster.conftest import list_records, wait_until
from tests.support.kube.apiserver import KubeCluster
from tests.support.kube.apiserver_fixtures import AGENT_NODE, AGENT_SA
from tests.support.kube.execwatch_process import ExecwatchProcess

OUTAGE = 60.0


class Agent(ExecwatchProcess):
    def __init__(self, kubeconfig: Path, spool: Path, owner: str, log: Path) -> None:
        super().__init__(
            [
                "agent",
                "--kubeconfig",
                str(kubeconfig),
                "--node",
                AGENT_NODE,
                "--spool-dir",
                str(spool),
                "--spool-owner",
                owner,
                "--aggregation-window",  # repeats go out a second later, not a minute
                "1",
            ],
            log,
        )

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)


@pytest.fixture
def start_agent(kube: KubeCluster, tmp_path: Path) -> Iterator[Callable[[str], Agent]]:
    kubeconfig = kube.kubeconfig(kube.node_token(*AGENT_SA, AGENT_NODE), tmp_path / "agent.kc")
    started: list[Agent] = []

    def start(owner: str) -> Agent:
        agent = Agent(kubeconfig, tmp_path / "spool", owner, tmp_path / f"{owner}.log")
        started.append(agent)
        wait_until(agent.serving, timeout=60)
        wait_until(lambda: "execwatch_kernel_exec_failures" in agent.metrics_text(), timeout=60)
        return agent

    yield start
    for agent in started:
        agent.stop()


def fail(binary: Path, times: int) -> None:
    for _ in range(times):
        with pytest.raises(OSError, match="Exec format error"):
            subprocess.run([str(binary)], check=False)


def counts_by_path(admin: client.ApiClient, paths: set[str]) -> dict[str, int]:
    out = dict.fromkeys(paths, 0)
    for r in list_records(admin):
        if r["spec"]["path"] in out:
            out[r["spec"]["path"]] += r["spec"]["count"]
    return out


def spooled_on_disk(spool: Path, paths: set[str]) -> int:
    """Failures of `paths` in the spool files, read as another process would."""
    import json

    total = 0
    for db in spool.glob("spool-*.db"):
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            for (body,) in conn.execute("SELECT body FROM records"):
                spec: dict[str, Any] = json.loads(body)["spec"]
                total += spec["count"] if spec["path"] in paths else 0
    return total


@pytest.fixture
def binaries(foreign_root: Path, tmp_path: Path) -> Callable[[int], list[Path]]:
    def make(n: int) -> list[Path]:
        out = []
        for _ in range(n):
            path = tmp_path / "bin" / f"fail-{uuid.uuid4().hex[:12]}"
            path.parent.mkdir(exist_ok=True)
            shutil.copy(foreign_root / "arm64/root/usr/bin/busybox", path)
            out.append(path)
        return out

    return make


def test_an_agent_killed_during_an_api_outage_loses_nothing(
    kube: KubeCluster,
    admin: client.ApiClient,
    start_agent: Callable[[str], Agent],
    binaries: Callable[[int], list[Path]],
    tmp_path: Path,
) -> None:
    first = start_agent("agent-pod")
    [warmup, *during] = binaries(6)
    fail(warmup, 1)  # the pipeline works: the first failure arrives at once
    wait_until(lambda: counts_by_path(admin, {str(warmup)})[str(warmup)] == 1, timeout=30)

    assert kube.apiserver is not None
    kube.apiserver.stop()
    down_since = time.monotonic()
    caused = {str(p): 0 for p in during}
    try:
        for i, binary in enumerate(during[:3]):  # before the kill
            fail(binary, 3 + i)
            caused[str(binary)] += 3 + i
        wait_until(lambda: spooled_on_disk(tmp_path / "spool", set(caused)) == 12, timeout=30)
        first.kill()
        assert first.proc.returncode == -signal.SIGKILL

        second = start_agent("agent-pod")  # the same pod's container, restarted
        for binary in during[1:]:  # after the restart: old keys and new ones
            fail(binary, 2)
            caused[str(binary)] += 2
        wait_until(lambda: second.metric("execwatch_publisher_replayed_total") >= 3, timeout=30)
        time.sleep(max(0.0, OUTAGE - (time.monotonic() - down_since)))
    finally:
        kube.restart_apiserver()

    wait_until(lambda: counts_by_path(admin, set(caused)) == caused, timeout=90)
    assert sum(caused.values()) == 12 + 8
    assert second.metric("execwatch_publisher_dropped_total") == 0
    wait_until(lambda: spooled_on_disk(tmp_path / "spool", set(caused)) == 0, timeout=10)
    time.sleep(2)  # nothing arrives twice, later
    assert counts_by_path(admin, set(caused)) == caused


def test_two_agents_on_one_node_during_a_surge_publish_each_failure_once(
    admin: client.ApiClient,
    start_agent: Callable[[str], Agent],
    binaries: Callable[[int], list[Path]],
) -> None:
    """The DaemonSet's surge: the new pod's probe runs next to the old one's, both see
    every failure; the old one publishes until it stops, the new one after."""
    before, during, after = binaries(3)
    old = start_agent("agent-old")
    fail(before, 3)
    wait_until(lambda: counts_by_path(admin, {str(before)})[str(before)] == 3, timeout=30)

    new = start_agent("agent-new")  # the surge pod, same node, same spool directory
    assert old.metric("execwatch_publisher_active") == 1
    assert new.metric("execwatch_publisher_active") == 0
    fail(during, 4)  # both probes see these
    wait_until(lambda: counts_by_path(admin, {str(during)})[str(during)] == 4, timeout=30)

    old.stop()  # SIGTERM, as the DaemonSet controller does once the new pod is ready
    assert old.proc.returncode == 0
    wait_until(lambda: new.metric("execwatch_publisher_active") == 1, timeout=10)
    fail(after, 5)
    paths = {str(before), str(during), str(after)}
    expected = {str(before): 3, str(during): 4, str(after): 5}
    wait_until(lambda: counts_by_path(admin, paths) == expected, timeout=30)
    assert new.metric("execwatch_publisher_handed_over_total") >= 4
    time.sleep(3)  # the new agent's folded repeats of `during` would arrive by now
    assert counts_by_path(admin, paths) == expected


def readyz(agent: Agent) -> int | None:
    """/readyz's status, or None while the port does not answer yet."""
    try:
        with urllib.request.urlopen(f"http://{agent.address}/readyz", timeout=2) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def holds_bpf_programs(pid: int) -> bool:
    fds = Path(f"/proc/{pid}/fdinfo")
    return any("prog_type:" in f.read_text() for f in fds.iterdir() if f.is_file())


def test_the_agent_is_ready_only_once_its_probe_is_loaded(
    kube: KubeCluster, tmp_path: Path
) -> None:
    kubeconfig = kube.kubeconfig(kube.node_token(*AGENT_SA, AGENT_NODE), tmp_path / "agent.kc")
    agent = Agent(kubeconfig, tmp_path / "spool", "ready", tmp_path / "ready.log")
    try:
        seen: list[int] = []
        deadline = time.monotonic() + 60
        while not seen or seen[-1] != 200:
            assert time.monotonic() < deadline, f"/readyz never 200: {seen[-5:]}"
            status = readyz(agent)
            if status is not None:
                seen.append(status)
                # The first 200 comes with the programs loaded, never before.
                assert status != 200 or holds_bpf_programs(agent.proc.pid)
            time.sleep(0.005)
        assert seen[0] == 503, "the port answers before the probe is loaded"
        assert set(seen) == {503, 200} and seen.index(200) == len(seen) - 1
    finally:
        agent.stop()
