"""The on-disk spool: real SQLite files and real flock locks in a temporary directory.

What a node's spool must guarantee: records survive the process, a damaged entry or file
is detected and counted (never sent, never a crash), two agents never share a file, and
the file of an agent that is gone is adopted exactly once.
"""

from __future__ import annotations

import multiprocessing
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from execwatch.agent.spool import Spool, SpoolError, StoredRecord


def record(name: str, count: int = 1, sealed: bool = False) -> StoredRecord:
    return StoredRecord(
        name=name,
        key=f'["c-{name}", "/bin/x", "ForeignArchitecture", 8]',
        body=f'{{"metadata": {{"name": "{name}"}}, "spec": {{"count": {count}}}}}',
        count=count,
        first_seen=1000.0,
        last_seen=1001.5,
        sealed=sealed,
    )


def test_records_written_are_replayed_by_the_next_process_of_the_same_owner(
    tmp_path: Path,
) -> None:
    s = Spool(tmp_path, "agent-x")
    s.write([record("a", 3), record("b", 2, sealed=True)], [])
    s.write([record("c")], ["a"])
    s.close()
    loaded = Spool(tmp_path, "agent-x").load()
    assert sorted((r.name, r.count, r.sealed) for r in loaded.records) == [
        ("b", 2, True),
        ("c", 1, False),
    ]
    assert loaded.corrupt == 0


def _write_and_die(directory: str) -> None:
    s = Spool(Path(directory), "victim")
    s.write([record("kept", 5)], [])
    import os
    import signal

    os.kill(os.getpid(), signal.SIGKILL)  # no close, no checkpoint: the WAL holds it


def test_a_sigkilled_owner_loses_no_committed_record(tmp_path: Path) -> None:
    proc = multiprocessing.get_context("spawn").Process(target=_write_and_die, args=(tmp_path,))
    proc.start()
    proc.join(30)
    assert proc.exitcode == -9
    loaded = Spool(tmp_path, "victim").load()
    assert [(r.name, r.count) for r in loaded.records] == [("kept", 5)]


def test_a_damaged_entry_is_dropped_counted_and_removed(tmp_path: Path) -> None:
    s = Spool(tmp_path, "agent-x")
    s.write([record("good", 1), record("bad", 7)], [])
    s.close()
    with sqlite3.connect(tmp_path / "spool-agent-x.db") as db:  # a flipped byte in a body
        db.execute("UPDATE records SET body = replace(body, 'bad', 'bAd') WHERE name = 'bad'")
    loaded = Spool(tmp_path, "agent-x").load()
    assert [r.name for r in loaded.records] == ["good"]
    assert loaded.corrupt == 7  # the count it still claims
    again = Spool(tmp_path / "other-dir", "y")  # unrelated: a fresh spool is empty
    assert again.load().records == []


def test_a_damaged_entry_with_an_implausible_count_still_counts_once(tmp_path: Path) -> None:
    s = Spool(tmp_path, "agent-x")
    s.write([record("bad", 2)], [])
    s.close()
    with sqlite3.connect(tmp_path / "spool-agent-x.db") as db:
        db.execute("UPDATE records SET count = -5")
    loaded = Spool(tmp_path, "agent-x").load()
    assert loaded.records == [] and loaded.corrupt == 1


def test_a_file_overwritten_with_garbage_is_counted_and_replaced(tmp_path: Path) -> None:
    s = Spool(tmp_path, "agent-x")
    s.write([record("a")], [])
    s.close()
    path = tmp_path / "spool-agent-x.db"
    path.write_bytes(b"\x00garbage" * 512)
    for suffix in ("-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    fresh = Spool(tmp_path, "agent-x")
    loaded = fresh.load()
    assert loaded.records == [] and loaded.corrupt == 1
    fresh.write([record("b")], [])  # and it works again
    fresh.close()
    assert [r.name for r in Spool(tmp_path, "agent-x").load().records] == ["b"]


def test_a_torn_tail_of_the_file_is_detected(tmp_path: Path) -> None:
    """Half a page at the end of the file (a torn write): SQLite reports the damage, the
    spool counts it and keeps what it could read."""
    s = Spool(tmp_path, "agent-x")
    s.write([record(f"r{i}", 1) for i in range(400)], [])
    s.close()
    path = tmp_path / "spool-agent-x.db"
    size = path.stat().st_size
    with path.open("r+b") as f:
        f.truncate(size - 2048)
    loaded = Spool(tmp_path, "agent-x").load()
    assert loaded.corrupt >= 1
    assert len(loaded.records) < 400


def test_two_live_agents_never_share_a_file(tmp_path: Path) -> None:
    first = Spool(tmp_path, "same-name")
    second = Spool(tmp_path, "same-name")  # e.g. a misconfigured owner name
    assert first.path != second.path
    first.write([record("one")], [])
    second.write([record("two")], [])
    assert second.adopt().files == 0  # the first one is alive: its file is not taken
    first.close()
    second.close()


def test_the_file_of_an_agent_that_is_gone_is_adopted_once(tmp_path: Path) -> None:
    old = Spool(tmp_path, "agent-old")
    old.write([record("o1", 2), record("o2", 3, sealed=True)], [])
    new = Spool(tmp_path, "agent-new")
    assert new.adopt().records == []  # old still runs (a surge): nothing is taken
    old.close()  # the old pod exits
    adopted = new.adopt()
    assert sorted((r.name, r.count, r.sealed) for r in adopted.records) == [
        ("o1", 2, False),
        ("o2", 3, True),
    ]
    assert not (tmp_path / "spool-agent-old.db").exists()
    assert new.adopt().records == []  # once
    new.close()
    assert sorted(r.name for r in Spool(tmp_path, "agent-new").load().records) == ["o1", "o2"]


def _adopt_in_child(directory: str, owner: str, out: Any, done: Any) -> None:
    s = Spool(Path(directory), owner)
    out.put(sorted(r.name for r in s.adopt().records))
    done.wait(60)  # stay alive: an agent that exits is itself adopted next
    s.close()


def test_two_agents_adopting_at_once_take_each_record_once(tmp_path: Path) -> None:
    for i in range(6):
        gone = Spool(tmp_path, f"gone-{i}")
        gone.write([record(f"g{i}-{j}") for j in range(50)], [])
        gone.close()
    ctx = multiprocessing.get_context("spawn")
    out, done = ctx.Queue(), ctx.Event()
    procs = [
        ctx.Process(target=_adopt_in_child, args=(tmp_path, f"new-{k}", out, done)) for k in (1, 2)
    ]
    for p in procs:
        p.start()
    taken = [out.get(timeout=60) for _ in procs]
    done.set()
    for p in procs:
        p.join(30)
    names = taken[0] + taken[1]
    assert len(names) == 300 and len(set(names)) == 300


def test_an_unusable_directory_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(SpoolError, match="spool"):
        Spool(blocker / "spool", "a")
