"""A file system that never answers must not stall the node pipeline (issue 9, item 2).

A real FUSE file system (tests/probe/hung_fuse.py, libfuse 3 through mfusepy) answers
the kernel's reads, so an exec of a foreign binary on it fails for real, but never
answers the reads of this process, which runs the pipeline like the agent does.
"""

from __future__ import annotations

import errno
import shutil
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from execwatch.node.stack import StackOptions
from execwatch.pipeline import ExecutorBudget, Heartbeat, PipelineOptions
from execwatch.record import ExecFailure, Reason
from execwatch.serving.exposition import serve
from execwatch.serving.http import BoundedServer
from tests.probe.conftest import Children
from tests.support.node.stack_runner import node_stack
from tests.support.wait import wait_until

BUDGET = 2.0


class Agent:
    """The node stack on the real probe, run by its own consume loop like the agent's,
    with /healthz served over HTTP on loopback."""

    server: BoundedServer

    def __init__(self) -> None:
        self.records: list[tuple[float, ExecFailure]] = []
        self.sink_blocked = threading.Event()
        self._unblock = threading.Event()

    @classmethod
    @contextmanager
    def open(cls) -> Iterator[Agent]:
        agent = cls()
        options = StackOptions(
            pipeline=PipelineOptions(window=0.05, budget=ExecutorBudget(seconds=BUDGET)),
            heartbeat=Heartbeat(stall_after=1.0),
        )
        with node_stack(options, agent._sink, loop="run") as running:
            agent.server = serve(
                ("127.0.0.1", 0), running.stack.registry, running.stack.heartbeat.problem
            )
            try:
                yield agent
            finally:
                agent._unblock.set()
                agent.server.shutdown()

    def _sink(self, failure: ExecFailure) -> None:
        self.records.append((time.monotonic(), failure))
        if self.sink_blocked.is_set():  # output that nobody reads (a full pipe)
            self._unblock.wait()

    def healthz(self) -> tuple[int, str]:
        url = f"http://127.0.0.1:{self.server.server_port}/healthz"
        try:
            with urllib.request.urlopen(url, timeout=5) as reply:
                return reply.status, reply.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def metric(self, name: str) -> str:
        url = f"http://127.0.0.1:{self.server.server_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as reply:
            text: str = reply.read().decode()
        return "\n".join(line for line in text.splitlines() if line.startswith(name))

    def wait(self, path: Path, timeout: float = 10.0) -> tuple[float, ExecFailure]:
        def found() -> tuple[float, ExecFailure] | None:
            return next(
                ((at, r) for at, r in list(self.records) if r.event.path == str(path)), None
            )

        seen: tuple[float, ExecFailure] = wait_until(
            found, timeout, step=0.005, explain=lambda: f"no record of {path}"
        )
        return seen


@pytest.fixture
def agent() -> Iterator[Agent]:
    with Agent.open() as running:
        yield running


def latency(agent: Agent, children: Children, binary: Path) -> float:
    assert children.exec(str(binary), linger=0.5) == errno.ENOEXEC
    failed_at = time.monotonic()
    at, record = agent.wait(binary)
    assert record.diagnosis.reason is Reason.FOREIGN_ARCHITECTURE, record.diagnosis
    return at - failed_at


def test_a_hung_file_system_stalls_neither_other_failures_nor_liveness(
    agent: Agent, children: Children, hung_mount: Path, hello_arm64: Path, tmp_path: Path
) -> None:
    local = []
    for i in range(16):
        local.append(tmp_path / f"local-{i}")
        shutil.copy(hello_arm64, local[-1])
    baseline = [latency(agent, children, b) for b in local[:4]]

    # The first failure on the hung mount: its diagnosis blocks in the kernel.
    assert children.exec(str(hung_mount / "app-0"), linger=3) == errno.ENOEXEC
    started = time.monotonic()
    during = [latency(agent, children, b) for b in local[4:10]]
    assert agent.healthz()[0] == 200

    at, hung = agent.wait(hung_mount / "app-0")
    assert BUDGET * 0.9 <= at - started < BUDGET + 2
    assert hung.diagnosis.reason is Reason.UNDIAGNOSED
    assert f"overran its {BUDGET:g} s budget in mount" in hung.diagnosis.detail
    assert str(hung_mount) in hung.diagnosis.detail

    # Later failures there are not waited for; the others still flow.
    for i in range(1, 4):
        assert children.exec(str(hung_mount / f"app-{i}"), linger=0.5) == errno.ENOEXEC
        failed_at = time.monotonic()
        at, later = agent.wait(hung_mount / f"app-{i}")
        assert at - failed_at < BUDGET / 2
        assert later.diagnosis.reason is Reason.UNDIAGNOSED
        assert "not waited for" in later.diagnosis.detail
    after = [latency(agent, children, b) for b in local[10:14]]
    assert agent.healthz()[0] == 200
    assert 'execwatch_pipeline_overruns_total{stage="diagnosis"} 1.0' in agent.metric(
        "execwatch_pipeline_overruns_total"
    )

    # Normal latency: none waited for the hung diagnosis (figures are the benchmark's
    # business; a loaded CI machine may add tenths of a second to any of them).
    assert max(during + after) < BUDGET / 2, (baseline, during, after)

    # Now the consume loop itself stalls (its output blocks): liveness turns unhealthy.
    agent.sink_blocked.set()
    for _ in range(2):  # a first record blocks the sink; the repeat waits in the loop's flush
        assert children.exec(str(local[14]), linger=0.2) == errno.ENOEXEC
    deadline = time.monotonic() + 10
    while (status := agent.healthz())[0] == 200 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert status[0] == 503
    assert "consume loop has not run for" in status[1]
