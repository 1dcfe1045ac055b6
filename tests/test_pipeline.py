"""Folding bursts of identical failures: emitted once, counted exactly."""

from __future__ import annotations

from pathlib import Path

import pytest

from execwatch.pipeline import NodePipeline
from execwatch.probe import layout
from execwatch.record import Diagnosis, ExecFailure, KernelEvent, Reason


def raw_event(path: bytes, *, cgroup: int = 7, err: int = 8, stale: bytes = b"") -> bytes:
    """A ring-buffer record; `stale` imitates bytes the ring buffer left after the NUL."""
    filename = (path + b"\0" + stale).ljust(layout.PATH_LEN, b"\0")
    return layout.EVENT_STRUCT.pack(
        1_000_000_000, cgroup, 1, 4026531840, 2, err, 10, 10, 1, 0, -100, 0, 0,
        b"sh", b"bash", filename, b"", b"",
    )  # fmt: skip


class CountingDiagnoser:
    def __init__(self, reason: Reason = Reason.FOREIGN_ARCHITECTURE) -> None:
        self.calls = 0
        self.reason = reason

    def diagnose(self, event: KernelEvent) -> Diagnosis:
        self.calls += 1
        return Diagnosis(self.reason, "amd64", "arm64")


@pytest.fixture
def emitted() -> list[ExecFailure]:
    return []


def pipeline(diagnoser: CountingDiagnoser, sink: list[ExecFailure], **kw: object) -> NodePipeline:
    return NodePipeline(diagnoser, sink.append, epoch_offset=0.0, **kw)  # type: ignore[arg-type]


def test_first_failure_is_emitted_at_once_and_repeats_fold_into_one_record(
    emitted: list[ExecFailure],
) -> None:
    diagnoser = CountingDiagnoser()
    p = pipeline(diagnoser, emitted)
    for _ in range(1000):
        p.on_record(raw_event(b"/app/server"))
    assert [f.count for f in emitted] == [1]

    p.flush()
    assert [f.count for f in emitted] == [1, 999]
    assert diagnoser.calls == 1
    assert emitted[1].diagnosis == emitted[0].diagnosis


def test_stale_bytes_after_the_path_do_not_split_a_burst(emitted: list[ExecFailure]) -> None:
    p = pipeline(CountingDiagnoser(), emitted)
    p.on_record(raw_event(b"/app/server", stale=b"garbage-from-an-older-record"))
    p.on_record(raw_event(b"/app/server", stale=b"other"))
    p.flush()
    assert [(f.event.path, f.count) for f in emitted] == [("/app/server", 1), ("/app/server", 1)]


def test_different_containers_and_errnos_are_kept_apart(emitted: list[ExecFailure]) -> None:
    p = pipeline(CountingDiagnoser(), emitted)
    p.on_record(raw_event(b"/bin/x", cgroup=1))
    p.on_record(raw_event(b"/bin/x", cgroup=2))
    p.on_record(raw_event(b"/bin/x", cgroup=2, err=2))
    assert [(f.event.cgroup_id, f.event.errno) for f in emitted] == [(1, 8), (2, 8), (2, 2)]


def test_evicting_a_slot_emits_its_pending_count(emitted: list[ExecFailure]) -> None:
    p = pipeline(CountingDiagnoser(), emitted, max_slots=2)
    for path in (b"/a", b"/a", b"/a", b"/b", b"/c"):
        p.on_record(raw_event(path))
    p.flush(final=True)
    counts: dict[str, int] = {}
    for f in emitted:
        counts[f.event.path] = counts.get(f.event.path, 0) + f.count
    assert counts == {"/a": 3, "/b": 1, "/c": 1}


def test_path_search_noise_is_counted_but_not_emitted(emitted: list[ExecFailure]) -> None:
    seen: list[tuple[int | str, Reason, bool]] = []

    class Observer:
        def delivered(self, errno: int | str, reason: Reason, *, aggregated: bool) -> None:
            seen.append((errno, reason, aggregated))

    p = pipeline(CountingDiagnoser(Reason.NOT_FOUND), emitted, observer=Observer())
    p.on_record(raw_event(b"/usr/local/bin/git", err=2))
    p.on_record(raw_event(b"/usr/local/bin/git", err=2))
    p.flush()
    assert emitted == []
    assert seen == [("ENOENT", Reason.NOT_FOUND, False), ("ENOENT", Reason.NOT_FOUND, True)]


def test_not_found_is_emitted_when_asked(emitted: list[ExecFailure], tmp_path: Path) -> None:
    p = pipeline(CountingDiagnoser(Reason.NOT_FOUND), emitted, show_not_found=True)
    p.on_record(raw_event(b"/usr/local/bin/git", err=2))
    assert len(emitted) == 1


def test_a_crashing_diagnosis_degrades_the_record_instead_of_losing_it(
    emitted: list[ExecFailure],
) -> None:
    class Broken:
        def diagnose(self, event: KernelEvent) -> Diagnosis:
            raise RuntimeError("bug")

    p = NodePipeline(Broken(), emitted.append, epoch_offset=0.0)
    p.on_record(raw_event(b"/app/server"))
    assert len(emitted) == 1
    assert emitted[0].diagnosis.reason is Reason.UNDIAGNOSED
    assert "diagnosis failed: RuntimeError('bug')" in emitted[0].diagnosis.detail
