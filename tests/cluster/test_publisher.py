"""The agent's publisher: aggregation, rate limit, bounded spool, retries, metrics.

The first half uses an in-memory sink to pin the logic down exactly; the second half
runs against the real API server with the agent's ServiceAccount.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from execwatch import crd
from execwatch.agent.metrics import PublisherMetrics
from execwatch.agent.publisher import Publisher, PublisherConfig
from execwatch.agent.records import RecordApi
from execwatch.agent.spool import Spool
from execwatch.kube import errors
from execwatch.record import AttributionStatus
from tests.cluster.conftest import NODE, list_records
from tests.cluster.test_crd import set_quota_usage
from tests.support.agent.exec_failures import exec_failure
from tests.support.kube.apiserver import KubeCluster
from tests.support.kube.apiserver_fixtures import AGENT_SA
from tests.support.wait import wait_until


class MemorySink:
    """Stores created objects by name; can be told to fail like an API server would."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.objects: dict[str, dict[str, Any]] = {}
        self.attempts = 0
        self.fail_with: int | None = None
        self.fail_message = "injected"
        self.refuse: dict[str, int] = {}  # path -> status, for that path's records only
        self.lose_answers = 0  # store the object, then raise as if the answer was lost
        self.times: list[float] = []
        self.lock = threading.Lock()
        self.released = threading.Event()  # cleared: a create waits on the wire
        self.released.set()
        self.on_wire = threading.Event()  # set when a create first waits

    def create(self, body: dict[str, Any]) -> None:
        if not self.released.is_set():
            self.on_wire.set()
            self.released.wait(timeout=10)
        with self.lock:
            self.attempts += 1
            name = body["metadata"]["name"]
            if self.fail_with is not None:
                raise errors.from_status(self.fail_with, "Injected", self.fail_message)
            if body["spec"]["path"] in self.refuse:
                raise errors.from_status(self.refuse[body["spec"]["path"]], "Injected")
            if name in self.objects:
                raise errors.from_status(409, "AlreadyExists")
            self.objects[name] = body
            self.times.append(self.clock())
            if self.lose_answers:
                self.lose_answers -= 1
                raise errors.from_status(0, "ReadTimeoutError")

    def counts(self) -> int:
        with self.lock:
            return sum(o["spec"]["count"] for o in self.objects.values())


def sample(m: PublisherMetrics, name: str, **labels: str) -> float:
    return m.registry.get_sample_value(name, labels) or 0.0


@pytest.fixture
def sink() -> MemorySink:
    return MemorySink()


@pytest.fixture
def make_publisher() -> Iterator[Any]:
    started: list[Publisher] = []

    def make(
        sink: Any,
        spool: Spool | None = None,
        clock: Callable[[], float] = time.monotonic,
        **config: Any,
    ) -> Publisher:
        settings: dict[str, Any] = {
            "aggregation_window": 60.0,
            "backoff_initial": 0.05,
            "backoff_max": 0.2,
        }
        settings.update(config)
        p = Publisher(PublisherConfig(node=NODE, **settings), sink, spool=spool, clock=clock)
        p.start()
        started.append(p)
        return p

    yield make
    for p in started:
        p.stop(flush_timeout=0)


def test_the_first_failure_is_published_at_once_with_the_full_record(
    sink: MemorySink, make_publisher: Any
) -> None:
    p = make_publisher(sink)
    p.submit(exec_failure(pod_name="web-0", namespace="shop", pod_uid="u1"))
    wait_until(lambda: sink.objects, timeout=2)
    [body] = sink.objects.values()
    assert body["spec"]["pod"] == {"name": "web-0", "namespace": "shop", "uid": "u1"}
    assert body["spec"]["count"] == 1 and body["spec"]["reason"] == "ForeignArchitecture"
    assert sample(p.metrics, "execwatch_publisher_published_total") == 1


def test_a_record_being_sent_still_counts_as_spooled(sink: MemorySink, make_publisher: Any) -> None:
    """While its create is on the wire the record is held by nobody else: the spool (and
    its gauge) must not read 0, or a full quota would look like an empty spool."""
    sink.released.clear()
    p = make_publisher(sink)
    p.submit(exec_failure(pod_name="web-0", namespace="shop"))
    assert sink.on_wire.wait(timeout=5)
    assert p.spooled() == 1
    sink.released.set()
    wait_until(lambda: p.spooled() == 0, timeout=5)


def test_a_record_is_sealed_on_disk_before_its_create_is_sent(
    sink: MemorySink, make_publisher: Any, tmp_path: Path
) -> None:
    """Killed while the create is on the wire, the next agent must re-send it unchanged
    (it may exist): folding more failures into it would lose them behind a 409."""
    sink.released.clear()
    p = make_publisher(sink, spool=Spool(tmp_path, "agent"))
    p.submit(exec_failure(pod_name="a", namespace="n", count=2))
    assert sink.on_wire.wait(timeout=5)
    with sqlite3.connect(f"file:{tmp_path / 'spool-agent.db'}?mode=ro", uri=True) as db:
        assert db.execute("SELECT count, sealed FROM records").fetchall() == [(2, 1)]
    sink.released.set()


def test_a_crash_loop_becomes_one_record_per_window_with_exact_counts(
    sink: MemorySink, make_publisher: Any
) -> None:
    p = make_publisher(sink, aggregation_window=0.5)
    t0 = time.time()
    p.submit(exec_failure(pod_name="web-0", namespace="shop", when=t0))
    wait_until(lambda: sink.objects, timeout=2)
    for i in range(1, 300):
        p.submit(exec_failure(pod_name="web-0", namespace="shop", when=t0 + i * 0.001))
    wait_until(lambda: sink.counts() == 300, timeout=5)
    bodies = sorted(sink.objects.values(), key=lambda b: b["spec"]["firstSeen"])
    assert [b["spec"]["count"] for b in bodies] == [1, 299]
    assert bodies[1]["spec"]["firstSeen"] < bodies[1]["spec"]["lastSeen"]
    assert sample(p.metrics, "execwatch_publisher_aggregated_total") == 298


@dataclass
class FakeClock:
    """Time that moves only when the test says; counts the reads of the publisher's
    thread since it last moved, so a test knows when the worker has seen the new time."""

    now: float = 0.0
    worker_reads: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self) -> float:
        with self.lock:
            if threading.current_thread().name == "execwatch-publisher":
                self.worker_reads += 1
            return self.now

    def set(self, now: float) -> None:
        with self.lock:
            self.now, self.worker_reads = now, 0


def crash_loop(
    p: Publisher, sink: MemorySink, clock: FakeClock, failures: set[int], sends: list[int]
) -> list[tuple[float, int]]:
    """Drive `p` through fake time in 5-s ticks up to the last failure + 300 s, one
    failure of one key at each time in `failures` (multiples of 5). A tick ends when the
    worker has looked for due records at the tick's time (its 2nd clock read: a loop's
    start, then `_next`) and made the creates `sends` expects by then. A failure never
    falls on a window's close, so every tick is deterministic. Returns the creates:
    (fake time, count), in order."""
    wall = time.time()
    for t in range(0, max(failures) + 301, 5):
        clock.set(float(t))
        if t in failures:
            p.submit(exec_failure(pod_name="web-0", namespace="shop", when=wall + t))
        wait_until(lambda: clock.worker_reads >= 2, timeout=5, step=0.001)
        due = sum(1 for s in sends if s <= t)
        wait_until(
            lambda: len(sink.times) == due,  # noqa: B023 - called at once, in this tick
            timeout=5,
            step=0.001,
            explain=lambda: f"at {clock.now}: creates at {sink.times}",
        )
    with sink.lock:
        counts = [b["spec"]["count"] for b in sink.objects.values()]
        return list(zip(sink.times, counts, strict=True))


def test_a_repeating_keys_window_doubles_up_to_the_cap_and_resets_after_quiet(
    make_publisher: Any,
) -> None:
    """A pod failing every 10 s: the first failure goes at once, then a record each time
    the window closes, the window 60, 120, 240, then 300 s (the cap). Quiet for a whole
    window, the key starts afresh: at once, then 60 s again. Every failure counted once."""
    clock = FakeClock()
    sink = MemorySink(clock)
    p = make_publisher(sink, clock=clock, aggregation_window_max=300.0, flush_interval=0.002)
    first = {0} | set(range(15, 1016, 10))  # a crash loop, then 385 s quiet (> 300)
    again = {1400} | set(range(1415, 1576, 10))
    sends = [0, 60, 180, 420, 720, 1020, 1400, 1460, 1580]
    assert crash_loop(p, sink, clock, first | again, sends) == [
        (0, 1),  # at once
        (60, 5),  # 15..55: the 60-s window closed with repeats in it
        (180, 12),  # 120 s
        (420, 24),  # 240 s
        (720, 30),  # 300 s: the cap
        (1020, 30),  # the window closing at 1320 is quiet: the key is forgotten
        (1400, 1),  # afresh: at once
        (1460, 5),
        (1580, 12),
    ]
    assert sink.counts() == len(first | again) == 120
    assert sample(p.metrics, "execwatch_publisher_published_failures_total") == 120


def test_a_cap_at_the_first_window_keeps_the_window_fixed(make_publisher: Any) -> None:
    clock = FakeClock()
    sink = MemorySink(clock)
    p = make_publisher(sink, clock=clock, aggregation_window_max=0.0, flush_interval=0.002)
    sends = [0, 60, 120, 180, 240, 300]
    creates = crash_loop(p, sink, clock, {0} | set(range(15, 296, 10)), sends)
    assert creates == [(0, 1), (60, 5), (120, 6), (180, 6), (240, 6), (300, 6)]


def test_different_containers_or_paths_are_not_folded_together(
    sink: MemorySink, make_publisher: Any
) -> None:
    p = make_publisher(sink)
    p.submit(exec_failure(pod_name="a", namespace="n", container="one"))
    p.submit(exec_failure(pod_name="a", namespace="n", container="two"))
    p.submit(exec_failure(pod_name="a", namespace="n", container="one", path="/other"))
    wait_until(lambda: len(sink.objects) == 3, timeout=2)


def test_creates_are_rate_limited(sink: MemorySink, make_publisher: Any) -> None:
    p = make_publisher(sink, rate=20.0, burst=5)
    for i in range(25):
        p.submit(exec_failure(pod_name=f"p{i}", namespace="n"))
    wait_until(lambda: len(sink.objects) == 25, timeout=5)
    # 5 from the burst, then 20 at 20/s: about one second, never much faster.
    assert sink.times[-1] - sink.times[0] >= 0.9


def test_an_outage_is_spooled_within_the_bound_and_the_excess_counted(
    sink: MemorySink, make_publisher: Any
) -> None:
    sink.fail_with = 503
    sink.released.clear()
    p = make_publisher(sink, spool_size=3)
    p.submit(exec_failure(pod_name="p0", namespace="n", count=2))
    assert sink.on_wire.wait(timeout=2)  # p0 is being sent: sealed, still holding its slot
    for i in range(1, 5):
        p.submit(exec_failure(pod_name=f"p{i}", namespace="n", count=2))
    p.submit(exec_failure(pod_name="p1", namespace="n", count=7))  # folds, no new slot
    assert sample(p.metrics, "execwatch_publisher_dropped_total", type="spool_full") == 4
    assert sample(p.metrics, "execwatch_publisher_spool_records") == 3
    sink.released.set()
    wait_until(lambda: sample(p.metrics, "execwatch_publisher_spooled_total") >= 1, timeout=2)
    sink.fail_with = None
    wait_until(lambda: p.spooled() == 0, timeout=5)
    assert sink.counts() == 3 * 2 + 7
    assert sample(p.metrics, "execwatch_publisher_api_errors_total", code="503") >= 1


def test_only_an_already_exists_conflict_means_the_record_was_made(
    sink: MemorySink, make_publisher: Any
) -> None:
    """A 409 for another reason created nothing (the fleet's quota races showed one): the
    record is retried, not counted as published and dropped."""
    sink.fail_with = 409
    sink.fail_message = "Precondition failed"  # a ConflictError, reason Injected
    p = make_publisher(sink)
    p.submit(exec_failure(pod_name="web-0", namespace="shop", count=3))
    wait_until(lambda: sink.attempts >= 2, timeout=5)
    assert sample(p.metrics, "execwatch_publisher_published_total") == 0
    sink.fail_with = None
    wait_until(lambda: p.spooled() == 0, timeout=5)
    assert sink.counts() == 3
    assert sample(p.metrics, "execwatch_publisher_published_failures_total") == 3


def test_a_retry_after_a_lost_answer_does_not_make_a_second_record(
    sink: MemorySink, make_publisher: Any
) -> None:
    sink.lose_answers = 1
    p = make_publisher(sink)
    p.submit(exec_failure(pod_name="a", namespace="n", count=4))
    wait_until(lambda: sample(p.metrics, "execwatch_publisher_published_total") == 1, timeout=3)
    assert sink.attempts == 2 and len(sink.objects) == 1 and sink.counts() == 4


def test_records_the_api_server_refuses_are_dropped_and_counted(
    sink: MemorySink, make_publisher: Any
) -> None:
    sink.fail_with = 422
    p = make_publisher(sink, refusal_grace=0.0)
    p.submit(exec_failure(pod_name="a", namespace="n", count=3))
    wait_until(
        lambda: sample(p.metrics, "execwatch_publisher_dropped_total", type="rejected"), timeout=2
    )
    assert sample(p.metrics, "execwatch_publisher_dropped_total", type="rejected") == 3
    assert p.spooled() == 0


def test_retries_back_off_instead_of_hammering_the_api_server(
    sink: MemorySink, make_publisher: Any
) -> None:
    sink.fail_with = 500
    sink_attempts_at = time.monotonic()
    p = make_publisher(sink, backoff_initial=0.1, backoff_max=1.0)
    p.submit(exec_failure(pod_name="a", namespace="n"))
    time.sleep(2.0)
    # 0.1, 0.2, 0.4, 0.8 (with jitter in [0.5, 1]): at most ~8 tries in 2 s, not hundreds.
    assert 2 <= sink.attempts <= 10, sink.attempts
    assert time.monotonic() - sink_attempts_at >= 2.0


def test_failures_without_a_pod_are_published_and_counted_as_unattributed(
    sink: MemorySink, make_publisher: Any
) -> None:
    p = make_publisher(sink)
    p.submit(exec_failure(status=AttributionStatus.HOST))
    p.submit(exec_failure(status=AttributionStatus.UNATTRIBUTED, path="/x"))
    wait_until(lambda: len(sink.objects) == 2, timeout=2)
    assert sample(p.metrics, "execwatch_publisher_unattributed_total") == 2
    assert {b["spec"]["attribution"] for b in sink.objects.values()} == {"host", "unattributed"}


def test_a_record_refused_forever_does_not_delay_healthy_ones(
    sink: MemorySink, make_publisher: Any
) -> None:
    """Issue 9: one record answered 500 again and again blocked 20 healthy ones."""
    sink.refuse["/poison"] = 500
    p = make_publisher(sink, backoff_initial=0.2, backoff_max=5.0)
    p.submit(exec_failure(pod_name="bad", namespace="n", path="/poison"))
    wait_until(lambda: sink.attempts >= 1, timeout=2)
    started = time.monotonic()
    for i in range(20):
        p.submit(exec_failure(pod_name=f"ok{i}", namespace="n"))
    wait_until(lambda: len(sink.objects) == 20, timeout=5)
    assert time.monotonic() - started < 2.0
    assert p.spooled() == 1  # the poisoned one still waits its turn, alone
    assert sample(p.metrics, "execwatch_publisher_api_errors_total", code="500") >= 1


def test_each_record_backs_off_on_its_own(sink: MemorySink, make_publisher: Any) -> None:
    sink.refuse["/poison"] = 500
    p = make_publisher(sink, backoff_initial=0.1, backoff_max=1.0)
    p.submit(exec_failure(pod_name="bad", namespace="n", path="/poison"))
    time.sleep(2.0)
    first = sink.attempts
    # 0.1, 0.2, 0.4, 0.8 ... (jitter in [0.5, 1]): a handful of tries in 2 s, not hundreds.
    assert 3 <= first <= 12, first
    for i in range(5):  # healthy records meanwhile go straight through
        p.submit(exec_failure(pod_name=f"ok{i}", namespace="n"))
    wait_until(lambda: len(sink.objects) == 5, timeout=2)


@pytest.mark.parametrize(
    ("status", "message"),
    [(400, "bad request"), (403, "denied by webhook"), (422, "spec.path: Too long")],
)
def test_permanent_refusals_are_dropped_and_counted_not_retried(
    sink: MemorySink, make_publisher: Any, status: int, message: str
) -> None:
    sink.fail_with, sink.fail_message = status, message
    p = make_publisher(sink, refusal_grace=0.0)
    p.submit(exec_failure(pod_name="a", namespace="n", count=3))
    wait_until(lambda: p.spooled() == 0, timeout=2)
    time.sleep(0.3)
    assert sink.attempts == 1
    assert sample(p.metrics, "execwatch_publisher_dropped_total", type="rejected") == 3


def test_a_refusal_must_last_the_grace_period_before_the_record_is_dropped(
    sink: MemorySink, make_publisher: Any
) -> None:
    """A kube-apiserver that has just started answers 403 until its RBAC caches fill."""
    sink.fail_with = 403
    p = make_publisher(sink, refusal_grace=0.6, backoff_initial=0.05, backoff_max=0.1)
    p.submit(exec_failure(pod_name="transient", namespace="n", count=2))
    wait_until(lambda: sink.attempts >= 2, timeout=2)
    sink.fail_with = None
    wait_until(lambda: sink.counts() == 2, timeout=2)

    sink.fail_with = 403
    started = time.monotonic()
    p.submit(exec_failure(pod_name="forever", namespace="n", count=5))
    wait_until(
        lambda: sample(p.metrics, "execwatch_publisher_dropped_total", type="rejected") == 5,
        timeout=5,
    )
    assert time.monotonic() - started >= 0.6 and p.spooled() == 0


def test_a_quota_refusal_is_not_permanent(sink: MemorySink, make_publisher: Any) -> None:
    sink.fail_with = 403
    sink.fail_message = 'execfailures "x" is forbidden: exceeded quota: execwatch-records'
    p = make_publisher(sink)
    p.submit(exec_failure(pod_name="a", namespace="n", count=2))
    wait_until(lambda: sink.attempts >= 2, timeout=3)
    assert p.spooled() == 1
    sink.fail_with = None
    wait_until(lambda: sink.counts() == 2, timeout=3)


def test_a_restart_replays_the_spool_with_exact_counts(
    sink: MemorySink, make_publisher: Any, tmp_path: Path
) -> None:
    sink.fail_with = 503
    p = make_publisher(sink, spool=Spool(tmp_path, "agent"))
    for i in range(10):
        p.submit(exec_failure(pod_name=f"p{i}", namespace="n", count=i + 1))
    for i in range(10):  # repeats fold into the held records
        p.submit(exec_failure(pod_name=f"p{i}", namespace="n", count=100))
    wait_until(lambda: sink.attempts >= 1, timeout=2)
    p.stop(flush_timeout=0)
    assert sink.objects == {}

    sink.fail_with = None
    again = make_publisher(sink, spool=Spool(tmp_path, "agent"))
    wait_until(lambda: again.spooled() == 0, timeout=5)
    assert sink.counts() == sum(range(1, 11)) + 10 * 100
    assert len(sink.objects) == 10
    assert sample(again.metrics, "execwatch_publisher_replayed_total") == 10


def test_a_record_that_may_exist_is_resent_unchanged_after_a_restart(
    sink: MemorySink, make_publisher: Any, tmp_path: Path
) -> None:
    """The create reached the server but the answer was lost, then the agent died: the
    next agent re-sends the same name, gets 409, and nothing is counted twice."""
    sink.lose_answers = 1
    p = make_publisher(sink, spool=Spool(tmp_path, "agent"), backoff_initial=30.0)
    p.submit(exec_failure(pod_name="a", namespace="n", count=4))
    wait_until(lambda: sink.attempts == 1, timeout=2)
    p.submit(exec_failure(pod_name="a", namespace="n", count=6))  # after the seal: new record
    p.stop(flush_timeout=0)
    again = make_publisher(sink, spool=Spool(tmp_path, "agent"))
    wait_until(lambda: again.spooled() == 0, timeout=5)
    assert sink.counts() == 10 and len(sink.objects) == 2
    assert sample(again.metrics, "execwatch_publisher_published_failures_total") == 10


def test_a_damaged_spool_entry_is_counted_as_a_drop(
    sink: MemorySink, make_publisher: Any, tmp_path: Path
) -> None:
    sink.fail_with = 503
    p = make_publisher(sink, spool=Spool(tmp_path, "agent"))
    p.submit(exec_failure(pod_name="a", namespace="n", count=3))
    p.submit(exec_failure(pod_name="b", namespace="n", count=4))
    wait_until(lambda: sink.attempts >= 1, timeout=2)
    p.stop(flush_timeout=0)
    with sqlite3.connect(tmp_path / "spool-agent.db") as db:
        db.execute("UPDATE records SET body = replace(body, '\"b\"', '\"B\"')")
    sink.fail_with = None
    again = make_publisher(sink, spool=Spool(tmp_path, "agent"))
    wait_until(lambda: again.spooled() == 0, timeout=5)
    assert sink.counts() == 3
    assert sample(again.metrics, "execwatch_publisher_dropped_total", type="corrupt") == 4


def test_the_byte_bound_of_the_spool_is_kept(sink: MemorySink, make_publisher: Any) -> None:
    sink.fail_with = 503
    p = make_publisher(sink, spool_bytes=4000)
    for i in range(10):
        p.submit(exec_failure(pod_name=f"p{i}", namespace="n"))
    held = p.spooled()
    assert 1 <= held < 10
    assert sample(p.metrics, "execwatch_publisher_dropped_total", type="spool_full") == 10 - held
    assert sample(p.metrics, "execwatch_publisher_spool_bytes") <= 4000


def test_two_agents_on_one_node_publish_each_failure_once(
    sink: MemorySink, make_publisher: Any, tmp_path: Path
) -> None:
    """An upgrade's surge: both agents' probes see every failure; the new one stands by
    until the old one hands over, then publishes only what came after."""
    offset = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
    old = make_publisher(sink, spool=Spool(tmp_path, "pod-old"))
    new = make_publisher(sink, spool=Spool(tmp_path, "pod-new"))
    t0 = time.time() - 60  # kernel times of failures, all in the past

    def both(i: int) -> None:  # one failure, seen by both probes
        for p in (old, new):
            p.submit(exec_failure(pod_name=f"p{i}", namespace="n", when=t0 + i, count=i + 1))

    for i in range(5):
        both(i)
    wait_until(lambda: len(sink.objects) == 5, timeout=3)
    assert new.spooled() == 0  # standing by: nothing of its own
    old.stop(handover_at=t0 + 4.5 - offset)  # consumed everything up to failure 4
    for i in range(5, 8):
        both(i)
    wait_until(lambda: len(sink.objects) == 8, timeout=5)
    assert sink.counts() == sum(range(1, 9))
    assert sample(new.metrics, "execwatch_publisher_handed_over_total") == sum(range(1, 6))


def test_the_new_agent_adopts_what_the_old_one_left_in_its_spool(
    sink: MemorySink, make_publisher: Any, tmp_path: Path
) -> None:
    sink.fail_with = 503
    old = make_publisher(sink, spool=Spool(tmp_path, "pod-old"))
    new = make_publisher(sink, spool=Spool(tmp_path, "pod-new"), adopt_interval=0.2)
    old.submit(exec_failure(pod_name="a", namespace="n", count=7))
    wait_until(lambda: sink.attempts >= 1, timeout=2)
    old.stop(flush_timeout=0)  # the API server is back only after the old pod is gone
    sink.fail_with = None
    wait_until(lambda: sink.counts() == 7, timeout=5)
    assert sample(new.metrics, "execwatch_publisher_replayed_total") == 1
    assert not (tmp_path / "spool-pod-old.db").exists()


def test_without_a_handover_the_next_agent_publishes_all_it_saw(
    sink: MemorySink, make_publisher: Any, tmp_path: Path
) -> None:
    """The old agent was killed and said nothing: publishing twice beats losing."""
    old = make_publisher(sink, spool=Spool(tmp_path, "pod-old"))
    new = make_publisher(sink, spool=Spool(tmp_path, "pod-new"))
    new.submit(exec_failure(pod_name="p", namespace="n", count=3))
    old.stop(flush_timeout=0)
    wait_until(lambda: sink.counts() == 3, timeout=5)


# -- against the real API server -------------------------------------------------------


def test_records_reach_the_api_server_with_the_agents_credentials(
    agent_rest: Any, admin: client.ApiClient, make_publisher: Any
) -> None:
    p = make_publisher(RecordApi(agent_rest, crd.DEFAULT_NAMESPACE), aggregation_window=0.5)
    p.submit(exec_failure(pod_name="web-0", namespace="shop", pod_uid="u1"))
    wait_until(lambda: list_records(admin), timeout=5)
    for _ in range(49):
        p.submit(exec_failure(pod_name="web-0", namespace="shop", pod_uid="u1"))
    wait_until(lambda: sum(r["spec"]["count"] for r in list_records(admin)) == 50, timeout=5)
    assert len(list_records(admin)) == 2
    assert sample(p.metrics, "execwatch_publisher_published_failures_total") == 50


def test_a_steady_repeat_makes_one_create_per_growing_window_on_the_api_server(
    agent_rest: Any, admin: client.ApiClient, make_publisher: Any
) -> None:
    """A failure every 0.1 s for 9 s, windows from 1 s doubling up to 4 s: creates at 0
    (the first failure), 1, 3 and 7 s, and the rest when the publisher stops: 5 records
    (a fixed 1-s window would make 10), every failure counted once."""
    p = make_publisher(
        RecordApi(agent_rest, crd.DEFAULT_NAMESPACE),
        aggregation_window=1.0,
        aggregation_window_max=4.0,
    )
    p.submit(exec_failure(pod_name="warm-up", namespace="shop"))  # the connection is open
    wait_until(lambda: sample(p.metrics, "execwatch_publisher_published_total") == 1, timeout=10)
    t0, caused = time.monotonic(), 0
    while (elapsed := time.monotonic() - t0) < 9.0:
        p.submit(exec_failure(pod_name="web-0", namespace="shop", pod_uid="u1"))
        caused += 1
        time.sleep(max(0.0, 0.1 * caused - elapsed))
    p.stop(flush_timeout=10)
    records = [r for r in list_records(admin) if r["spec"]["pod"]["name"] == "web-0"]
    counts = sorted((r["spec"]["firstSeen"], r["spec"]["count"]) for r in records)
    assert len(records) == 5, counts
    assert sum(r["spec"]["count"] for r in records) == caused
    assert sample(p.metrics, "execwatch_publisher_published_failures_total") == caused + 1


def test_an_api_server_outage_loses_nothing_within_the_spool(
    kube: KubeCluster, admin: client.ApiClient, make_publisher: Any
) -> None:
    agent = kube.rest(kube.node_token(*AGENT_SA, NODE), timeout=2.0)
    p = make_publisher(
        RecordApi(agent, crd.DEFAULT_NAMESPACE), backoff_initial=0.2, backoff_max=1.0
    )
    assert kube.apiserver is not None
    kube.apiserver.stop()
    try:
        for i in range(20):
            p.submit(exec_failure(pod_name=f"p{i % 10}", namespace="shop"))
        wait_until(lambda: sample(p.metrics, "execwatch_publisher_spooled_total") >= 1, timeout=10)
    finally:
        kube.restart_apiserver()
    wait_until(lambda: p.spooled() == 0, timeout=30)
    records = list_records(admin)
    assert sum(r["spec"]["count"] for r in records) == 20
    assert len(records) == 10
    assert sample(p.metrics, "execwatch_publisher_dropped_total", type="spool_full") == 0


def test_a_full_quota_keeps_records_spooled_until_there_is_room(
    agent_rest: Any, admin: client.ApiClient, make_publisher: Any
) -> None:
    set_quota_usage(admin, 5000)
    try:
        p = make_publisher(RecordApi(agent_rest, crd.DEFAULT_NAMESPACE))
        p.submit(exec_failure(pod_name="a", namespace="n", count=2))
        wait_until(
            lambda: sample(p.metrics, "execwatch_publisher_api_errors_total", code="403"), timeout=5
        )
        assert list_records(admin) == [] and p.spooled() == 1
    finally:
        set_quota_usage(admin, 0)
    wait_until(lambda: list_records(admin), timeout=10)
    assert sample(p.metrics, "execwatch_publisher_dropped_total", type="spool_full") == 0


@pytest.fixture
def poison_webhook(admin: client.ApiClient) -> Iterator[str]:
    """A real admission webhook that fails (500 from the API server) for records of one
    path only: its URL is a closed loopback port, and failurePolicy is Fail."""
    path = "/poison/never-created"
    name = "execwatch-test-poison"
    body = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": "poison.execwatch.io",
                "clientConfig": {"url": "https://127.0.0.1:1/validate"},
                "rules": [
                    {
                        "apiGroups": [crd.GROUP],
                        "apiVersions": [crd.VERSION],
                        "operations": ["CREATE"],
                        "resources": [crd.PLURAL],
                    }
                ],
                "matchConditions": [
                    {"name": "poisoned-path", "expression": f"object.spec.path == '{path}'"}
                ],
                "failurePolicy": "Fail",
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": 2,
            }
        ],
    }
    api = client.AdmissionregistrationV1Api(admin)
    api.create_validating_webhook_configuration(body)
    try:
        yield path
    finally:
        api.delete_validating_webhook_configuration(name)


def test_a_record_the_api_server_fails_forever_does_not_delay_healthy_ones(
    agent_rest: Any, admin: client.ApiClient, make_publisher: Any, poison_webhook: str
) -> None:
    p = make_publisher(
        RecordApi(agent_rest, crd.DEFAULT_NAMESPACE), backoff_initial=0.5, backoff_max=30.0
    )
    p.submit(exec_failure(pod_name="bad", namespace="n", path=poison_webhook, count=5))
    wait_until(
        lambda: sample(p.metrics, "execwatch_publisher_api_errors_total", code="500"), timeout=10
    )
    started = time.monotonic()
    for i in range(20):
        p.submit(exec_failure(pod_name=f"ok{i}", namespace="n"))
    wait_until(lambda: len(list_records(admin)) == 20, timeout=10)
    took = time.monotonic() - started
    assert took < 5.0, took  # on main: 0 of 20 in 5 s
    # The last create's reply may still be on its way: until then that record is in flight.
    wait_until(lambda: p.spooled() == 1, timeout=5)
    assert all(r["spec"]["path"] != poison_webhook for r in list_records(admin))
