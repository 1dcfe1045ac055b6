"""Each cgroup has a budget of ring-buffer records: a tenant storming unique failing names
cannot crowd out another tenant's one real failure. What it sends over budget is counted
per cgroup as shed, and its failures are still counted exactly.

Real cgroups in this kernel's cgroup v2 hierarchy, real failing execs, a small ring buffer
that nothing reads until the storm is over.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from execwatch.attribution.mounts import cgroup_mounts
from execwatch.node.metrics import NodeMetrics
from execwatch.probe import Probe
from execwatch.probe.events import decode_record
from execwatch.probe.fairness import ShedWatch, with_pods
from execwatch.probe.loader import ProbeOptions, budget_config
from execwatch.record import Attribution, AttributionStatus, ExecFailed, KernelEvent

STORM = 3000  # unique names: folding sends each one
RING = 1 << 18  # 256 KiB: about 230 records
BURST = 20
RATE = 10.0  # a second of storm lets a few more through


@pytest.fixture
def tenants() -> Iterator[tuple[Path, Path]]:
    """Two sibling cgroups: a (the storm) and b (one failure)."""
    unified = cgroup_mounts().unified
    assert unified is not None, "these tests need a cgroup v2 hierarchy"
    parent = unified.mountpoint / f"execwatch-fair-{os.getpid()}"
    a, b = parent / "a", parent / "b"
    for path in (parent, a, b):
        path.mkdir()
    try:
        yield a, b
    finally:
        for path in (a, b, parent):
            path.rmdir()


def fail_in(cgroup: Path, paths: list[str]) -> None:
    """A child joins `cgroup` and execs each path once; every one must fail."""
    pid = os.fork()
    if pid == 0:  # the child never returns
        failed = 0
        try:
            (cgroup / "cgroup.procs").write_text(str(os.getpid()))
            for path in paths:
                try:
                    os.execv(path, [path])
                except OSError:
                    failed += 1
        finally:
            os._exit(0 if failed == len(paths) else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def storm_names(cgroup: Path, n: int) -> list[str]:
    return [f"/nonexistent-{cgroup.stat().st_ino}/tool-{i}" for i in range(n)]


def delivered(probe: Probe, raw: list[bytes]) -> list[KernelEvent]:
    while probe.poll(10):
        pass
    return [decode_record(r, 0.0) for r in raw]


def storm_then_one_failure(probe: Probe, a: Path, b: Path, binary: Path) -> list[KernelEvent]:
    """A storms while nothing reads the ring, then B fails once; what arrived."""
    raw: list[bytes] = []
    probe.open_ring_buffer(raw.append)
    fail_in(a, storm_names(a, STORM))
    fail_in(b, [str(binary)])
    return delivered(probe, raw)


def test_a_storm_of_unique_names_does_not_crowd_out_another_cgroups_failure(
    tenants: tuple[Path, Path], foreign_root: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    a, b = tenants
    a_id, b_id = a.stat().st_ino, b.stat().st_ino
    binary = tmp_path / "arm64-tool"
    shutil.copy(foreign_root / "arm64/root/usr/bin/busybox", binary)
    options = ProbeOptions(ringbuf_bytes=RING, budget_rate=RATE, budget_burst=BURST)
    with (
        Probe(options) as probe,
        caplog.at_level(logging.WARNING, logger="execwatch.probe.fairness"),
    ):
        events = storm_then_one_failure(probe, a, b, binary)
        from_b = [e for e in events if e.cgroup_id == b_id and isinstance(e, ExecFailed)]
        assert [(e.path, e.errno) for e in from_b] == [(str(binary), errno.ENOEXEC)]

        from_a = len([e for e in events if e.cgroup_id == a_id])
        shed = probe.shed_by_cgroup()
        assert probe.counts_by_cgroup()[(a_id, errno.ENOENT)] == STORM  # exact as ever
        assert BURST <= from_a < BURST + 2 * RATE  # the burst, and what the rate refilled
        assert shed[a_id] == STORM - from_a  # every record withheld, counted for A
        assert b_id not in shed
        assert probe.stats()["cgroup_budget"] >= shed[a_id]  # the total, exact, host-wide

        top = probe.shed_top()
        assert top is not None
        assert top[0]["cgroup"].endswith(f"/{a.parent.name}/a")
        registry = CollectorRegistry()
        NodeMetrics(registry, probe)
        gauge = registry.get_sample_value(
            "execwatch_kernel_cgroup_budget_top", {"cgroup": top[0]["cgroup"]}
        )
        assert gauge == top[1] >= shed[a_id]  # another test's storm may lead: it is larger

        probe.forget_counts(lambda _cgroup: True)  # the sweep names the crowding cgroup
        logged = [r for r in caplog.records if getattr(r, "kv", {}).get("cgroup_id") == a_id]
        assert [r.kv["shed"] for r in logged] == [shed[a_id]]  # type: ignore[attr-defined]
        assert logged[0].kv["cgroup"] == top[0]["cgroup"]  # type: ignore[attr-defined]
        probe.forget_counts(lambda _cgroup: True)  # nothing new since: not logged again
        assert len([r for r in caplog.records if r.kv.get("cgroup_id") == a_id]) == 1  # type: ignore[attr-defined]


def test_without_a_budget_the_storm_crowds_it_out(
    tenants: tuple[Path, Path], foreign_root: Path, tmp_path: Path
) -> None:
    a, b = tenants
    binary = tmp_path / "arm64-tool"
    shutil.copy(foreign_root / "arm64/root/usr/bin/busybox", binary)
    with Probe(ProbeOptions(ringbuf_bytes=RING, budget_rate=0)) as probe:
        events = storm_then_one_failure(probe, a, b, binary)
        assert not [e for e in events if e.cgroup_id == b.stat().st_ino]
        assert probe.stats()["ringbuf_full"] > 0
        assert probe.stats()["cgroup_budget"] == 0
        assert probe.counts_by_cgroup()[(a.stat().st_ino, errno.ENOENT)] == STORM


def test_the_default_budget_sends_every_record_of_a_burst_of_distinct_failures(
    tenants: tuple[Path, Path],
) -> None:
    """A container start whose PATH searches miss 400 distinct names at once (far more
    than a crash loop's few failures a second) loses none of them."""
    a, _ = tenants
    raw: list[bytes] = []
    with Probe() as probe:
        probe.open_ring_buffer(raw.append)
        fail_in(a, storm_names(a, 400))
        events = delivered(probe, raw)
        assert len([e for e in events if e.cgroup_id == a.stat().st_ino]) == 400
        assert a.stat().st_ino not in probe.shed_by_cgroup()


def test_a_budget_is_a_rate_and_a_burst_or_nothing() -> None:
    assert budget_config(100, 500) == {"budget_interval_ns": 10**7, "budget_burst_ns": 499 * 10**7}
    assert budget_config(0, 1) == {"budget_interval_ns": 0, "budget_burst_ns": 0}
    with pytest.raises(ValueError, match="burst >= 1"):
        budget_config(10, 0)


def test_the_crowding_cgroup_is_named_by_its_path_and_its_pod_when_attribution_knows_it(
    tenants: tuple[Path, Path],
) -> None:
    a, b = tenants
    pod = Attribution(AttributionStatus.ATTRIBUTED, namespace="shop", pod="web-1", container="app")
    pods = {a.stat().st_ino: pod}
    describe = with_pods(lambda cg: pods.get(cg, Attribution()))
    assert describe(a.stat().st_ino) == {
        "cgroup": f"/{a.parent.name}/a",
        "namespace": "shop",
        "pod": "web-1",
        "container": "app",
    }
    assert describe(b.stat().st_ino) == {"cgroup": f"/{a.parent.name}/b"}
    assert describe(1 << 60) == {"cgroup": f"id:{1 << 60}"}  # gone, or never was


def test_each_sweep_names_the_cgroup_that_lost_most_since_the_last() -> None:
    watch = ShedWatch(lambda cg: {"cgroup": f"/c{cg}"})
    first = watch.sweep({1: 10, 2: 40})
    assert first is not None
    assert (first.cgroup_id, first.shed, first.cgroups) == (2, 40, 2)
    second = watch.sweep({1: 60, 2: 45})
    assert second is not None
    assert (second.cgroup_id, second.shed, second.shed_total) == (1, 50, 60)
    assert watch.sweep({1: 60, 2: 45}) is None  # nothing new: no log line
    evicted = watch.sweep({1: 60, 2: 7})  # its entry was evicted and made anew
    assert evicted is not None
    assert (evicted.cgroup_id, evicted.shed) == (2, 7)
