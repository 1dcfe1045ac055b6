"""Folding bursts of identical failures: emitted once, counted exactly."""

from __future__ import annotations

import ctypes
import enum
import multiprocessing
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import ClassVar, cast

import pytest
from prometheus_client import CollectorRegistry

from execwatch.diagnosis import FileDiagnoser
from execwatch.diagnosis.budget import Mount, SlowMounts
from execwatch.node.metrics import NodeMetrics, undiagnosed_summary
from execwatch.pipeline import Heartbeat, NodePipeline, repeat_key
from execwatch.probe import events, layout
from execwatch.record import (
    Attribution,
    Diagnosis,
    ExecFailure,
    KernelEvent,
    Kind,
    Reason,
    RepeatKey,
    UndiagnosedCause,
)
from tests.support.node.pipeline import make_pipeline

MNTNS = 4026531840


def raw_event(path: bytes, *, cgroup: int = 7, err: int = 8, stale: bytes = b"") -> bytes:
    """A ring-buffer record; `stale` imitates bytes the ring buffer left after the NUL."""
    filename = (path + b"\0" + stale).ljust(layout.PATH_LEN, b"\0")
    return layout.EXEC_FAILED.pack(
        ktime_ns=1_000_000_000, cgroup_id=cgroup, cgroup_parent_id=1, mntns=MNTNS,
        root_ino=2, err=err, pid=10, tgid=10, ppid=1, dirfd=-100, comm=b"sh",
        parent_comm=b"bash", filename=filename,
    )  # fmt: skip


def raw_death(*, exit_code: int = 0, signal: int = 0, exe_dev: int = 8, exe_ino: int = 8) -> bytes:
    """An early death's record, where raw_event's failures happen."""
    return layout.EARLY_DEATH.pack(
        ktime_ns=1_000_000_000, cgroup_id=7, cgroup_parent_id=1, mntns=MNTNS, root_ino=2,
        pid=10, tgid=10, ppid=1, comm=b"app", parent_comm=b"sh", exe_ino=exe_ino, exe_dev=exe_dev,
        exit_code=exit_code if not signal else -1, signal=signal,
        cause=layout.DEATH_SIGNAL if signal else layout.DEATH_LOADER_EXIT,
        exe_path=b"server/app/", exe_flags=layout.EXE_PATH_OK,
    )  # fmt: skip


def raw_emulated(path: bytes) -> bytes:
    """An exec a binfmt_misc emulator ran, where raw_event's failures happen."""
    return layout.EMULATED.pack(
        ktime_ns=1_000_000_000, cgroup_id=7, cgroup_parent_id=1, mntns=MNTNS, root_ino=2,
        pid=10, tgid=10, ppid=1, comm=b"app", parent_comm=b"sh", filename=path,
        interp=b"/usr/bin/qemu-aarch64-static", arch=b"arm64",
    )  # fmt: skip


class CountingDiagnoser:
    """Counts its calls in shared memory: diagnosis runs in the pipeline's worker processes."""

    def __init__(self, reason: Reason = Reason.FOREIGN_ARCHITECTURE) -> None:
        self._calls = multiprocessing.Value("i", 0)
        self.reason = reason

    @property
    def calls(self) -> int:
        return int(self._calls.value)

    def diagnose(self, event: KernelEvent) -> Diagnosis:
        with self._calls.get_lock():
            self._calls.value += 1
        return Diagnosis(self.reason, "amd64", "arm64")


@pytest.fixture
def emitted() -> list[ExecFailure]:
    return []


@pytest.fixture
def pipeline(
    pipelines: list[NodePipeline],
) -> Callable[..., NodePipeline]:
    def make(diagnoser: object, sink: list[ExecFailure], **kw: object) -> NodePipeline:
        p = make_pipeline(diagnoser, sink.append, **kw)
        pipelines.append(p)
        return p

    return make


def settled(p: NodePipeline) -> NodePipeline:
    assert p.drain(5.0), "the workers did not finish"
    return p


def test_first_failure_is_emitted_at_once_and_repeats_fold_into_one_record(
    emitted: list[ExecFailure], pipeline: Callable[..., NodePipeline]
) -> None:
    diagnoser = CountingDiagnoser()
    p = pipeline(diagnoser, emitted)
    for _ in range(1000):
        p.on_record(raw_event(b"/app/server"))
    settled(p)
    assert [f.count for f in emitted] == [1]

    p.flush()
    assert [f.count for f in emitted] == [1, 999]
    assert diagnoser.calls == 1
    assert emitted[1].diagnosis == emitted[0].diagnosis


def test_stale_bytes_after_the_path_do_not_split_a_burst(
    emitted: list[ExecFailure], pipeline: Callable[..., NodePipeline]
) -> None:
    p = pipeline(CountingDiagnoser(), emitted)
    p.on_record(raw_event(b"/app/server", stale=b"garbage-from-an-older-record"))
    p.on_record(raw_event(b"/app/server", stale=b"other"))
    settled(p).flush()
    assert [(f.event.path, f.count) for f in emitted] == [("/app/server", 1), ("/app/server", 1)]


def test_different_containers_and_errnos_are_kept_apart(
    emitted: list[ExecFailure], pipeline: Callable[..., NodePipeline]
) -> None:
    p = pipeline(CountingDiagnoser(), emitted)
    p.on_record(raw_event(b"/bin/x", cgroup=1))
    p.on_record(raw_event(b"/bin/x", cgroup=2))
    p.on_record(raw_event(b"/bin/x", cgroup=2, err=2))
    settled(p)
    assert sorted((f.event.cgroup_id, f.event.status) for f in emitted) == [
        (1, "ENOEXEC"),
        (2, "ENOENT"),
        (2, "ENOEXEC"),
    ]


def test_evicting_a_slot_emits_its_pending_count(
    emitted: list[ExecFailure], pipeline: Callable[..., NodePipeline]
) -> None:
    p = pipeline(CountingDiagnoser(), emitted, max_slots=2)
    for path in (b"/a", b"/a", b"/a", b"/b", b"/c"):
        p.on_record(raw_event(path))
    settled(p).flush(final=True)
    counts: dict[str, int] = {}
    for f in emitted:
        counts[f.event.path] = counts.get(f.event.path, 0) + f.count
    assert counts == {"/a": 3, "/b": 1, "/c": 1}


class Observer:
    def __init__(self) -> None:
        self.seen: list[tuple[int | str, Reason, bool, int]] = []
        self.drops: dict[str, int] = {}
        self.overruns: list[str] = []

    def delivered(
        self,
        errno: int | str,
        reason: Reason,
        *,
        aggregated: bool,
        count: int = 1,
        cause: object = None,
    ) -> None:
        self.seen.append((errno, reason, aggregated, count))

    def dropped(self, kind: str, count: int = 1) -> None:
        self.drops[kind] = self.drops.get(kind, 0) + count

    def overran(self, stage: str) -> None:
        self.overruns.append(stage)


def test_path_search_noise_is_counted_but_not_emitted(
    emitted: list[ExecFailure], pipeline: Callable[..., NodePipeline]
) -> None:
    observer = Observer()
    p = pipeline(CountingDiagnoser(Reason.NOT_FOUND), emitted, observer=observer)
    p.on_record(raw_event(b"/usr/local/bin/git", err=2))
    p.on_record(raw_event(b"/usr/local/bin/git", err=2))
    settled(p).flush()
    assert emitted == []
    assert observer.seen == [
        ("ENOENT", Reason.NOT_FOUND, False, 1),
        ("ENOENT", Reason.NOT_FOUND, True, 1),
    ]


class KernelFolds:
    def __init__(self, *batches: dict[layout.FoldedName, int]) -> None:
        self.batches = list(batches)

    def take_folds(self) -> dict[layout.FoldedName, int]:
        return self.batches.pop(0) if self.batches else {}


def test_repeats_folded_in_the_kernel_are_credited_to_their_records_slot(
    emitted: list[ExecFailure], pipeline: Callable[..., NodePipeline]
) -> None:
    """The kernel sent the first miss and counted 999 repeats: one record says 999 more."""
    observer = Observer()
    name = (7, 4026531840, 2, 2, b"/usr/local/bin/git")
    other_root = (7, 4026531840, 3, 2, b"/usr/local/bin/git")
    folds = KernelFolds({name: 999, other_root: 5})
    p = pipeline(
        CountingDiagnoser(Reason.NOT_FOUND),
        emitted,
        observer=observer,
        folds=folds,
        show_not_found=True,
    )
    p.on_record(raw_event(b"/usr/local/bin/git", err=2))
    settled(p).flush()
    assert [(f.event.path, f.count) for f in emitted] == [
        ("/usr/local/bin/git", 1),
        ("/usr/local/bin/git", 999),
    ]
    assert observer.seen == [
        ("ENOENT", Reason.NOT_FOUND, False, 1),
        ("ENOENT", Reason.NOT_FOUND, True, 999),
        ("ENOENT", Reason.UNDIAGNOSED, True, 5),  # no record of that root reached us
    ]


def test_records_of_different_kinds_with_colliding_numbers_never_fold_together(
    emitted: list[ExecFailure], pipeline: Callable[..., NodePipeline]
) -> None:
    """Pairs equal in every number but their kind: a failed exec with no name and errno 11
    and a death by signal 11 of an unreadable executable; the same with errno 127 << 8
    and the loader's exit 127 (that wait status); a failed exec with errno 0 and an
    emulated exec of one name, folded by the kernel too. Each kind's repeats count on its
    own record."""
    records = [
        raw_event(b"", err=11),
        raw_death(signal=11, exe_dev=0, exe_ino=0),
        raw_event(b"", err=127 << 8),
        raw_death(exit_code=127, exe_dev=0, exe_ino=0),
        raw_event(b"/app/server", err=0),
        raw_emulated(b"/app/server"),
    ]
    keys = [repeat_key(raw) for raw in records]
    assert len({k._replace(kind=0) for k in keys}) == 3, "the numbers collide in pairs"
    assert len(set(keys)) == 6
    diagnoser = CountingDiagnoser()
    failed, emulated = (7, MNTNS, 2, 0, b"/app/server"), (7, MNTNS, 2, 0, b"/app/server", 3)
    assert RepeatKey.of_fold(*emulated) == keys[5]
    p = pipeline(diagnoser, emitted, folds=KernelFolds({failed: 40, emulated: 50}))
    for _ in range(3):
        for raw in records:
            p.on_record(raw)
    settled(p).flush()
    totals: dict[tuple[Kind, str], int] = {}
    for f in emitted:
        status = (f.event.kind, f.event.status)
        totals[status] = totals.get(status, 0) + f.count
    assert totals == {
        (Kind.EXEC_FAILED, "EAGAIN"): 3,
        (Kind.EARLY_DEATH, "SIGSEGV"): 3,
        (Kind.EXEC_FAILED, str(127 << 8)): 3,
        (Kind.EARLY_DEATH, "EXIT127"): 3,
        (Kind.EXEC_FAILED, "0"): 3 + 40,
        (Kind.EMULATED, "EMULATED"): 3 + 50,
    }
    assert diagnoser.calls == len(records)


class ProbeKind(enum.IntEnum):
    """A kind of record the probe does not send: one for the test below."""

    SAMPLE = 99


class Sample(ctypes.Structure):
    _fields_ = (("head", layout.Head), ("value", ctypes.c_uint64))


SAMPLE = layout.Record(ProbeKind.SAMPLE, "EW_KIND_SAMPLE", Sample)


@dataclass(frozen=True, slots=True, kw_only=True)
class SampleEvent(KernelEvent):
    """The new kind's event: the fields it has."""

    kind: ClassVar[Kind] = cast(Kind, ProbeKind.SAMPLE)
    value: int


def decode_sample(raw: bytes, epoch_offset: float) -> SampleEvent:
    r = SAMPLE.unpack(raw)
    return SampleEvent(
        time=epoch_offset + r.ktime_ns / 1e9, pid=r.pid, tgid=r.tgid, ppid=r.ppid,
        uid=r.uid, comm="", parent_comm="", path=str(r.value), cgroup_id=r.cgroup_id,
        mntns=r.mntns, syscall="", root_ino=r.root_ino, value=r.value,
    )  # fmt: skip


def sample_key(raw: bytes) -> RepeatKey:
    r = SAMPLE.unpack(raw)
    return RepeatKey(r.cgroup_id, r.mntns, r.root_ino, ProbeKind.SAMPLE, r.value)


class SampleDiagnoser(FileDiagnoser):
    """The new kind's diagnosis, which its entry calls."""

    def sample(self, event: SampleEvent) -> Diagnosis:
        return Diagnosis(Reason.UNDIAGNOSED, self.node_arch, detail=f"sample {event.value}")


def diagnose_sample(by: events.Diagnoses, event: SampleEvent) -> Diagnosis:
    assert isinstance(by, SampleDiagnoser)
    return by.sample(event)


def test_a_new_kind_of_record_is_one_entry(
    monkeypatch: pytest.MonkeyPatch,
    emitted: list[ExecFailure],
    pipeline: Callable[..., NodePipeline],
) -> None:
    """Decoding, repeat keys, folding and the diagnoser's dispatch all go by the record's
    kind through probe.events.KINDS: one more entry there carries a new kind of record
    through the pipeline, apart from the others' records with the same numbers."""
    entry = events.RecordKind(
        SampleEvent, SAMPLE, decode_sample, sample_key, diagnose_sample, reads_files=False
    )
    monkeypatch.setattr(events, "KINDS", MappingProxyType({**events.KINDS, SAMPLE.kind: entry}))
    sample = SAMPLE.pack(cgroup_id=7, mntns=MNTNS, root_ino=2, pid=10, tgid=10, value=11)
    p = pipeline(SampleDiagnoser(), emitted)
    for raw in (sample, raw_event(b"11", err=11), sample, sample):
        p.on_record(raw)
    settled(p).flush()
    by_kind = {int(f.event.kind): f for f in emitted if f.count == 1}
    assert sorted(by_kind) == [Kind.EXEC_FAILED, ProbeKind.SAMPLE]
    assert by_kind[ProbeKind.SAMPLE].diagnosis.detail == "sample 11"
    assert by_kind[ProbeKind.SAMPLE].event.status == "SAMPLE"
    assert sorted((f.event.kind, f.count) for f in emitted) == [
        (Kind.EXEC_FAILED, 1),
        (ProbeKind.SAMPLE, 1),
        (ProbeKind.SAMPLE, 2),
    ]


def test_every_kind_has_one_entry_the_diagnoser_dispatches_on() -> None:
    """Each kind of record the probe sends: decoded into its own event type, keyed with its
    kind, and diagnosed by the callable its entry holds, but an enoexec exit, which only
    decides a held failure's fate."""
    assert sorted(events.KINDS) == sorted(Kind)
    for kind, entry in events.KINDS.items():
        raw = entry.layout.pack(cgroup_id=7, mntns=MNTNS, root_ino=2)
        decoded = events.decode_record(raw, 0.0)
        assert type(decoded) is entry.event
        assert decoded.kind is entry.event.kind is Kind(kind)
        assert events.repeat_key(raw).kind == kind
        if kind == Kind.ENOEXEC_EXIT:
            assert entry.diagnose is None
            with pytest.raises(ValueError, match="ENOEXEC_EXIT records are not diagnosed"):
                FileDiagnoser().diagnose(decoded)
        else:
            assert callable(entry.diagnose)
    assert not events.KINDS[Kind.EMULATED].reads_files
    assert not events.KINDS[Kind.ENOEXEC_EXIT].reads_files


def test_not_found_is_emitted_when_asked(
    emitted: list[ExecFailure], pipeline: Callable[..., NodePipeline]
) -> None:
    p = pipeline(CountingDiagnoser(Reason.NOT_FOUND), emitted, show_not_found=True)
    p.on_record(raw_event(b"/usr/local/bin/git", err=2))
    settled(p)
    assert len(emitted) == 1


def test_a_crashing_diagnosis_degrades_the_record_instead_of_losing_it(
    emitted: list[ExecFailure], pipeline: Callable[..., NodePipeline]
) -> None:
    class Broken:
        def diagnose(self, event: KernelEvent) -> Diagnosis:
            raise RuntimeError("bug")

    p = pipeline(Broken(), emitted)
    p.on_record(raw_event(b"/app/server"))
    settled(p)
    assert len(emitted) == 1
    assert emitted[0].diagnosis.reason is Reason.UNDIAGNOSED
    assert emitted[0].diagnosis.cause is UndiagnosedCause.FAILED
    assert "diagnosis failed: RuntimeError('bug')" in emitted[0].diagnosis.detail


class Hang:
    """A read blocked in the kernel (a pipe nobody writes), like one on a hung mount."""

    def __init__(self) -> None:
        self._r, self._w = os.pipe()

    def wait(self) -> None:
        os.read(self._r, 1)

    def set(self) -> None:
        os.write(self._w, b"x" * 16)


class Blocking:
    """A diagnosis that hangs for one path, like a read on a file system that never answers."""

    def __init__(self, hang_on: str) -> None:
        self.hang_on = hang_on
        self.release = Hang()

    def diagnose(self, event: KernelEvent) -> Diagnosis:
        if event.path == self.hang_on:
            self.release.wait()
        return Diagnosis(Reason.FOREIGN_ARCHITECTURE, "amd64", "arm64")


def test_a_hung_diagnosis_times_out_and_others_keep_flowing(
    emitted: list[ExecFailure], pipeline: Callable[..., NodePipeline]
) -> None:
    diagnoser = Blocking("/fuse/app")
    observer = Observer()
    p = pipeline(diagnoser, emitted, budget=0.3, observer=observer)
    started = time.monotonic()
    p.on_record(raw_event(b"/fuse/app"))
    assert time.monotonic() - started < 0.05, "the consume loop waited for diagnosis"
    for i in range(20):
        p.on_record(raw_event(b"/bin/x%d" % i))
    settled(p)
    diagnoser.release.set()
    by_path = {f.event.path: f.diagnosis for f in emitted}
    assert len(by_path) == 21
    assert by_path["/fuse/app"].reason is Reason.UNDIAGNOSED
    assert by_path["/fuse/app"].cause is UndiagnosedCause.OVERRAN
    assert "overran its 0.3 s budget" in by_path["/fuse/app"].detail
    assert {d.reason for p_, d in by_path.items() if p_ != "/fuse/app"} == {
        Reason.FOREIGN_ARCHITECTURE
    }
    assert observer.overruns == ["diagnosis"]


def test_a_full_queue_reports_undiagnosed_and_counts_the_drop(
    emitted: list[ExecFailure], pipeline: Callable[..., NodePipeline]
) -> None:
    diagnoser = Blocking("/hang")
    observer = Observer()
    p = pipeline(diagnoser, emitted, budget=5.0, workers=1, queue_size=1, observer=observer)
    p.on_record(raw_event(b"/hang"))
    time.sleep(0.1)  # the only worker is now blocked; one record fits in the queue
    p.on_record(raw_event(b"/queued"))
    p.on_record(raw_event(b"/dropped"))
    assert [(f.event.path, f.diagnosis.detail) for f in emitted] == [
        ("/dropped", "not diagnosed: the diagnosis queue was full")
    ]
    assert observer.drops == {"diagnosis_queue_full": 1}
    assert emitted[0].diagnosis.cause is UndiagnosedCause.OVERLOADED
    diagnoser.release.set()
    settled(p)
    assert sorted(f.event.path for f in emitted) == ["/dropped", "/hang", "/queued"]


def test_the_heartbeat_fails_only_when_the_loop_stops() -> None:
    beat = Heartbeat(stall_after=0.2)
    assert beat.problem() is None
    time.sleep(0.3)
    assert "has not run for" in (beat.problem() or "")
    beat.beat()
    assert beat.problem() is None


def test_a_hung_attribution_keeps_the_diagnosis(
    emitted: list[ExecFailure], pipeline: Callable[..., NodePipeline]
) -> None:
    release = Hang()

    class HungAttributor:
        def resolve(self, cgroup_id: int, pid: int | None = None, **kw: object) -> Attribution:
            release.wait()
            return Attribution()

    observer = Observer()
    p = pipeline(
        CountingDiagnoser(), emitted, attributor=HungAttributor(), budget=0.3, observer=observer
    )
    p.on_record(raw_event(b"/app/server"))
    settled(p)
    release.set()
    assert [f.diagnosis.reason for f in emitted] == [Reason.FOREIGN_ARCHITECTURE]
    assert emitted[0].attribution == Attribution()
    assert observer.overruns == ["attribution"]


def test_a_diagnosis_that_is_only_slow_is_left_to_finish(
    emitted: list[ExecFailure], pipeline: Callable[..., NodePipeline]
) -> None:
    """Running Python on a starved CPU is not a hung mount: no overrun, no Undiagnosed."""

    class Slow:
        def diagnose(self, event: KernelEvent) -> Diagnosis:
            deadline = time.monotonic() + 0.5
            while time.monotonic() < deadline:  # busy, not blocked in the kernel
                pass
            return Diagnosis(Reason.FOREIGN_ARCHITECTURE, "amd64", "arm64")

    observer = Observer()
    p = pipeline(Slow(), emitted, budget=0.1, observer=observer)
    p.on_record(raw_event(b"/app/server"))
    settled(p)
    assert [f.diagnosis.reason for f in emitted] == [Reason.FOREIGN_ARCHITECTURE]
    assert observer.overruns == []


def test_undiagnosed_failures_are_counted_by_cause_from_zero() -> None:
    registry = CollectorRegistry()
    metrics = NodeMetrics(registry)
    for cause in UndiagnosedCause:  # a first one is an increase() from 0
        assert registry.get_sample_value("execwatch_undiagnosed_total", {"cause": cause}) == 0
    assert undiagnosed_summary(registry) == "0 failures seen, 0 undiagnosed"

    metrics.delivered(8, Reason.FOREIGN_ARCHITECTURE, aggregated=False, count=5)
    metrics.delivered(8, Reason.UNDIAGNOSED, aggregated=False, cause=UndiagnosedCause.OVERRAN)
    metrics.delivered(
        8, Reason.UNDIAGNOSED, aggregated=True, count=2, cause=UndiagnosedCause.SLOW_MOUNT
    )

    slow = {"cause": "slow_mount"}
    assert registry.get_sample_value("execwatch_undiagnosed_total", slow) == 2
    assert undiagnosed_summary(registry) == (
        "8 failures seen, 3 undiagnosed (2 slow_mount, 1 overran)"
    )


def test_a_failure_that_never_stops_repeating_is_diagnosed_again_in_time(
    emitted: list[ExecFailure], pipeline: Callable[..., NodePipeline]
) -> None:
    """A loop failing every 0.1 s folds into one record, yet its diagnosis is not reused
    past `rediagnose_after`: a file changed under the loop is diagnosed anew."""
    diagnoser = CountingDiagnoser()
    p = pipeline(diagnoser, emitted, window=0.2, rediagnose_after=0.5)
    for _ in range(8):
        p.on_record(raw_event(b"/app/server"))
        settled(p)
        time.sleep(0.1)
    p.flush(final=True)

    assert diagnoser.calls == 2
    assert sum(f.count for f in emitted) == 8


def test_a_slow_mount_mark_expires(tmp_path: Path) -> None:
    """A mount marked slow is refused for `forget_after`, then tried again."""
    slow = SlowMounts(forget_after=0.3)
    mount = Mount(44, "0:53", str(tmp_path))
    slow.mark(mount)
    assert [r.mount for r in slow.refusals()] == [mount]
    time.sleep(0.4)
    assert slow.refusals() == ()
