"""A PATH search's misses are folded in the kernel: each name's first record per window is
sent, its repeats only counted there, and user space still sees every failure exactly,
with its own diagnosis. A binary whose loader is missing fails with ENOENT too: it is a
name of its own, never folded into the misses around it, wherever it sits in the search.
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import shutil
import struct
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from execwatch.node.stack import StackOptions
from execwatch.pipeline import PipelineOptions, repeat_key
from execwatch.probe import Probe, layout
from execwatch.record import ExecFailure, Reason, RepeatKey
from tests.support.node.stack_runner import Running, node_stack
from tests.support.probe.debian_roots import GLIBC_LOADER

SEARCHES = 400
WINDOW_S = 0.2
NAME = "ewprog"


class KernelFoldsSeen:
    """The probe's take_folds(), keeping what it handed to the pipeline."""

    def __init__(self, probe: Probe) -> None:
        self.probe = probe
        self.taken: Counter[layout.FoldedName] = Counter()

    def take_folds(self) -> dict[layout.FoldedName, int]:
        folds = self.probe.take_folds()
        self.taken.update(folds)
        return folds


class Traced:
    """The node stack on the real probe, run as `execwatch trace` runs it, and what the
    kernel sent and folded."""

    def __init__(self, running: Running, raw: list[bytes], folds: KernelFoldsSeen) -> None:
        self.records = running.records
        self.raw = raw
        self.folds = folds
        self.stop = running.stop_loop


@pytest.fixture
def traced() -> Iterator[Traced]:
    raw: list[bytes] = []
    seen: list[KernelFoldsSeen] = []

    def tap(record: bytes, on_record: Callable[[bytes], None]) -> None:
        raw.append(record)
        on_record(record)

    def folds(probe: Probe) -> KernelFoldsSeen:
        seen.append(KernelFoldsSeen(probe))
        return seen[0]

    options = StackOptions(
        pipeline=PipelineOptions(window=WINDOW_S, show_not_found=True), folds=folds, tap=tap
    )
    with node_stack(options, loop="run") as running:
        yield Traced(running, raw, seen[0])


def without_its_loader(dest: Path) -> Path:
    """/usr/bin/true whose PT_INTERP names a loader that does not exist: the file is there,
    yet its exec fails with ENOENT (a glibc binary in an alpine image, on this host)."""
    data = Path("/usr/bin/true").read_bytes()
    gone = GLIBC_LOADER.replace(".so.2", ".so.9").encode()
    assert data.count(GLIBC_LOADER.encode()) == 1
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(data.replace(GLIBC_LOADER.encode(), gone))
    dest.chmod(0o755)
    return dest


def search_path(tmp_path: Path, *, loaderless: int, found: bool) -> list[Path]:
    """Five PATH directories: NAME in directory `loaderless` lacks its loader, the last
    holds the real program when `found`, the others lack NAME."""
    dirs = [tmp_path / f"d{i}" for i in range(5)]
    for d in dirs:
        d.mkdir()
    without_its_loader(dirs[loaderless] / NAME)
    if found:
        shutil.copy("/usr/bin/true", dirs[-1] / NAME)
    return dirs


def search_in(cgroup: Path, dirs: list[Path], n: int) -> None:
    """A shell in `cgroup` runs `env NAME` n times: glibc's execvp tries each directory."""
    loop = f"i=0; while [ $i -lt {n} ]; do /usr/bin/env {NAME}; i=$((i+1)); done; exit 0"
    subprocess.run(
        ["/bin/sh", "-c", loop],
        env={"PATH": ":".join(map(str, dirs))},
        check=True,
        capture_output=True,
        preexec_fn=lambda: (cgroup / "cgroup.procs").write_text(str(os.getpid())),
    )


def counted(records: list[ExecFailure], cgroup_id: int) -> Counter[tuple[str, Reason]]:
    """(path, reason) -> failures the pipeline accounted for in this cgroup."""
    out: Counter[tuple[str, Reason]] = Counter()
    for r in records:
        if r.event.cgroup_id == cgroup_id:
            out[(r.event.path, r.diagnosis.reason)] += r.count
    return out


@pytest.mark.parametrize(
    ("loaderless", "found"),
    [(2, True), (4, False)],
    ids=["loaderless-mid-search-then-hit", "loaderless-is-the-final-failure"],
)
def test_search_storm_is_folded_in_the_kernel_and_counted_exactly(
    traced: Traced, own_cgroup: Path, tmp_path: Path, loaderless: int, found: bool
) -> None:
    dirs = search_path(tmp_path, loaderless=loaderless, found=found)
    started = time.monotonic()
    search_in(own_cgroup, dirs, SEARCHES)
    windows = (time.monotonic() - started) / WINDOW_S + 1
    traced.stop()

    cgroup_id = own_cgroup.stat().st_ino
    failures = 5 * SEARCHES if not found else 4 * SEARCHES
    assert traced.folds.probe.counts_by_cgroup()[(cgroup_id, errno.ENOENT)] == failures

    sent = [raw for raw in traced.raw if repeat_key(raw)[0] == cgroup_id]
    folded = sum(n for name, n in traced.folds.taken.items() if name[0] == cgroup_id)
    assert len(sent) + folded == failures
    assert len(sent) <= len(dirs) * (os.cpu_count() or 1) * windows  # not one per miss

    expected = Counter(
        {(str(d / NAME), Reason.NOT_FOUND): SEARCHES for i, d in enumerate(dirs) if i != loaderless}
    )
    if found:
        del expected[(str(dirs[-1] / NAME), Reason.NOT_FOUND)]
    expected[(str(dirs[loaderless] / NAME), Reason.MISSING_INTERPRETER)] = SEARCHES
    assert counted(traced.records, cgroup_id) == expected


def test_one_name_in_two_roots_is_never_folded_together(
    traced: Traced, own_cgroup: Path, tmp_path: Path
) -> None:
    """Two chroots of one mount namespace and cgroup: /app/tool lacks its loader in one
    and does not exist in the other. Neither hides the other."""
    with_tool, without = tmp_path / "with", tmp_path / "without"
    without_its_loader(with_tool / "app/tool")
    (without / "app").mkdir(parents=True)
    pid = os.fork()
    if pid == 0:  # never returns
        try:
            (own_cgroup / "cgroup.procs").write_text(str(os.getpid()))
            for root in (with_tool, without):
                if os.fork() == 0:
                    os.chroot(root)
                    for _ in range(SEARCHES):
                        with contextlib.suppress(OSError):
                            os.execv("/app/tool", ["/app/tool"])
                    os._exit(0)
                os.wait()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    traced.stop()

    by_root: Counter[tuple[int, Reason]] = Counter()
    for r in traced.records:
        if r.event.cgroup_id == own_cgroup.stat().st_ino:
            by_root[(r.event.root_ino, r.diagnosis.reason)] += r.count
    assert by_root == {
        (with_tool.stat().st_ino, Reason.MISSING_INTERPRETER): SEARCHES,
        (without.stat().st_ino, Reason.NOT_FOUND): SEARCHES,
    }


MASK32, MASK64 = (1 << 32) - 1, (1 << 64) - 1
FMIX = (0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53)


def nh(word: int, key: int) -> int:
    lo, hi = ((word + key) & MASK32), (((word >> 32) + (key >> 32)) & MASK32)
    return lo * hi


def fold_tag(key: list[int], cgroup_id: int, name: bytes) -> int:
    """fold_tag() of execwatch.bpf.c, for a miss of this process's root."""
    mntns, root_ino = _root()
    data = name + b"\0" + b"\0" * (-(len(name) + 1) % 8)
    words = [w for (w,) in struct.iter_unpack("<Q", data)]
    h = sum(nh(w, key[i]) for i, w in enumerate(words))
    n = layout.FOLD_WORDS
    h += nh(cgroup_id, key[n]) + nh(root_ino, key[n + 1]) + nh(mntns | len(name) << 32, key[n + 2])
    return (h & MASK64) | 1


def set_of(tag: int) -> int:
    """fold_set() of execwatch.bpf.c on CPU 0."""
    x = tag
    for factor in FMIX:
        x ^= x >> 33
        x = (x * factor) & MASK64
    x ^= x >> 33
    return x >> (64 - 4)


def test_one_searchs_names_spread_over_the_sets() -> None:
    """A PATH search's names differ in a byte (d0/, d1/, ...), so their tags are in
    arithmetic progression. Were the set a plain multiple of the tag, 1 key in 64 would
    put five of them in one set of four ways, and one would never be folded (the kernel
    agrees with set_of(): see the next test). Over 4,096 keys, none does here."""
    rng = random.Random(27)
    names = [b"/tmp/pytest-of-root/pytest-3/test_a_removed_cgroups_last_fo0/d%d/ewprog" % i
             for i in range(5)]  # fmt: skip
    crowded = 0
    for _ in range(4096):
        key = [rng.getrandbits(64) for _ in range(layout.FOLD_WORDS + 3)]
        sets = Counter(set_of(fold_tag(key, 1234, name)) for name in names)
        crowded += max(sets.values()) > layout.FOLD_WAYS
    assert crowded == 0


def sharing_a_set(key: list[int], cgroup_id: int, first: bytes) -> list[bytes]:
    """first and as many other absolute names as a set has slots, all in first's set."""
    want = set_of(fold_tag(key, cgroup_id, first))
    names = [first]
    for i in range(100_000):
        other = first + b"-%d" % i
        if set_of(fold_tag(key, cgroup_id, other)) == want:
            names.append(other)
            if len(names) > layout.FOLD_WAYS:
                return names
    raise AssertionError("too few names share the set")


def sent_per_name(sent: list[bytes], cgroup_id: int) -> Counter[bytes]:
    return Counter(key.name for key in map(repeat_key, sent) if key.cgroup_id == cgroup_id)


def test_a_name_that_finds_its_set_full_is_never_folded(own_cgroup: Path) -> None:
    """A set of slots holds as many names as it has slots. One more name whose tag picks
    the same set is never folded into any of them: it is sent every time while they
    fold, and each is counted under its own name. (Were fold_tag() here not the
    kernel's, the last name would pick another set, and fold.)"""
    cgroup_id = own_cgroup.stat().st_ino
    sent: list[bytes] = []
    with Probe(fold_window_s=60.0) as probe:
        *held, last = sharing_a_set(probe.fold_key, cgroup_id, b"/nonexistent/ewprog-set")
        probe.open_ring_buffer(sent.append)
        miss_on_one_cpu(own_cgroup, [*held, last], SEARCHES)
        while probe.poll(10):
            pass
        taken = probe.take_folds()
    assert sent_per_name(sent, cgroup_id) == {**dict.fromkeys(held, 1), last: SEARCHES}
    key = (cgroup_id, *_root(), errno.ENOENT)
    assert {k: n for k, n in taken.items() if k[0] == cgroup_id} == {
        (*key, name): SEARCHES - 1 for name in held
    }


def test_a_slot_changes_names_only_once_its_folds_were_read(own_cgroup: Path) -> None:
    """A slot's name stops folding when its epoch ends; the slot goes to another name
    only after a take_folds() a window later has read it again, so no fold of one name
    is ever credited to another."""
    cgroup_id = own_cgroup.stat().st_ino
    sent: list[bytes] = []
    taken: list[dict[layout.FoldedName, int]] = []
    with Probe(fold_window_s=0.3) as probe:
        *held, last = sharing_a_set(probe.fold_key, cgroup_id, b"/nonexistent/ewprog-owner")
        probe.open_ring_buffer(sent.append)
        for names in (held, [last], [last]):
            miss_on_one_cpu(own_cgroup, names, 3)
            time.sleep(0.35)
            taken.append(probe.take_folds())  # a window has passed: each starts an epoch
        while probe.poll(10):
            pass
    key = (cgroup_id, *_root(), errno.ENOENT)
    assert [{k: n for k, n in t.items() if k[0] == cgroup_id} for t in taken] == [
        {(*key, name): 2 for name in held},
        {},  # the slots' names have not been read since their epoch ended
        {(*key, last): 2},
    ]
    assert sent_per_name(sent, cgroup_id) == {**dict.fromkeys(held, 1), last: 3 + 1}


def miss_on_one_cpu(cgroup: Path, names: list[bytes], times: int) -> None:
    """A child in `cgroup`, on CPU 0 only (folding is per CPU), misses `names` in turn
    `times` times."""
    pid = os.fork()
    if pid == 0:  # never returns
        try:
            (cgroup / "cgroup.procs").write_text(str(os.getpid()))
            os.sched_setaffinity(0, {0})
            for _ in range(times):
                for name in names:
                    with contextlib.suppress(OSError):
                        os.execv(name, [name])
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def test_a_new_fold_window_sends_a_names_next_miss_again(own_cgroup: Path) -> None:
    """A CPU folds a name's repeats only in the fold epoch of the record it sent; the first
    take_folds() a window after the last starts the next epoch, whose first miss is sent."""
    name = b"/nonexistent/ewprog-window"
    cgroup_id = own_cgroup.stat().st_ino
    sent: list[bytes] = []
    with Probe(fold_window_s=0.3) as probe:
        probe.open_ring_buffer(sent.append)
        miss_on_one_cpu(own_cgroup, [name], 3)  # no take_folds() yet: one epoch, however slow
        time.sleep(0.35)
        first = probe.take_folds()  # a window has passed: this starts the next epoch
        miss_on_one_cpu(own_cgroup, [name], 3)
        while probe.poll(10):
            pass
        time.sleep(0.35)
        second = probe.take_folds()
    key = (cgroup_id, *_root(), errno.ENOENT, name)
    folded = RepeatKey.of_fold(*key)
    assert sum(repeat_key(raw) == folded for raw in sent) == 2  # one per epoch
    assert {k: n for k, n in first.items() if k[0] == cgroup_id} == {key: 2}
    assert {k: n for k, n in second.items() if k[0] == cgroup_id} == {key: 2}


def test_folds_taken_after_a_quiet_spell_are_all_handed_over(own_cgroup: Path) -> None:
    """take_folds() finds nothing new while the slots stand still; the next miss makes it
    credit again, and nothing folded meanwhile is lost or counted twice."""
    name = b"/nonexistent/ewprog-quiet"
    key = (own_cgroup.stat().st_ino, *_root(), errno.ENOENT, name)
    with Probe(fold_window_s=60.0) as probe:
        miss_on_one_cpu(own_cgroup, [name], 3)
        taken = [probe.take_folds() for _ in range(4)]  # the last ones find nothing new
        miss_on_one_cpu(own_cgroup, [name], 2)
        taken += [probe.take_folds() for _ in range(2)]
    assert [{k: n for k, n in t.items() if k == key} for t in taken] == [
        {key: 2},
        {},
        {},
        {},
        {key: 2},
        {},
    ]


def _root() -> tuple[int, int]:
    """This process's mount namespace and root inode, as a fold key holds them."""
    return os.stat("/proc/self/ns/mnt").st_ino, os.stat("/").st_ino


def test_a_removed_cgroups_last_folds_are_handed_over_once(
    own_cgroup: Path, tmp_path: Path
) -> None:
    """The pruner drops a removed cgroup's counts and fold totals; what its slots counted
    since the last take_folds() comes with the next one, and never again."""
    dirs = [tmp_path / f"d{i}" for i in range(5)]
    for d in dirs:
        d.mkdir()
    cgroup_id = own_cgroup.stat().st_ino
    sent: list[bytes] = []
    taken: Counter[layout.FoldedName] = Counter()
    with Probe(fold_window_s=60.0) as probe:
        probe.open_ring_buffer(sent.append)
        search_in(own_cgroup, dirs, SEARCHES)  # NAME is nowhere: five misses per search
        taken.update(probe.take_folds())
        search_in(own_cgroup, dirs, SEARCHES)
        while probe.poll(10):
            pass
        assert probe.counts_by_cgroup()[(cgroup_id, errno.ENOENT)] == 10 * SEARCHES

        assert probe.forget_counts(lambda cgroup: cgroup != cgroup_id) == 2  # count, folds
        taken.update(probe.take_folds())
        assert (cgroup_id, errno.ENOENT) not in probe.counts_by_cgroup()
        assert not [name for name in probe.take_folds() if name[0] == cgroup_id]
    ours = [raw for raw in sent if repeat_key(raw)[0] == cgroup_id]
    folded = sum(n for name, n in taken.items() if name[0] == cgroup_id)
    assert len(ours) + folded == 10 * SEARCHES
    assert len(ours) <= len(dirs) * (os.cpu_count() or 1)  # one per name and CPU at most
