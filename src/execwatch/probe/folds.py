"""User space's half of the kernel's folding (bpf/execwatch.h, "Folding"): the repeats of a
PATH-search miss that the probe counted in its per-CPU slots instead of sending, credited
to their names exactly once, and the fold clock that ends each epoch.

A slot's count is never reset, and the probe gives a slot to another name only when its
epoch is older than `harvested`: every count of the slot's last name was then read here
after its epoch ended. So whatever a slot counted since the last read belongs to the name
it holds now."""

from __future__ import annotations

import ctypes
import mmap
import time
from collections.abc import Callable

from execwatch.probe import layout

FOLDED_MASK = 0xFFFFFFFF  # ew_fold_slot.folded is 32 bits and wraps
SLOT_SIZE = ctypes.sizeof(layout.FoldSlot)
SLOT_WORDS = SLOT_SIZE // 4  # u32 words per slot; folded is the last
NAME_SIZE = ctypes.sizeof(layout.FoldName)
CgroupErr = tuple[int, int]


class FoldSlots:
    """The mmapped fold_slots and fold_names maps and the fold clock (.data) of one probe.
    Not thread-safe: the Probe serialises calls."""

    def __init__(
        self,
        slots_fd: int,
        names_fd: int,
        entries: int,
        write_clock: Callable[[layout.FoldClock], None],
        window_s: float,
    ) -> None:
        self._entries = entries
        self._slots = _map(slots_fd, entries * SLOT_SIZE)
        self._names = _map(names_fd, entries * NAME_SIZE)
        self._write_clock = write_clock
        self._window_s = window_s
        self._clock = layout.FoldClock(epoch=1, harvested=1)
        self._started = time.monotonic()
        self._seen = [0] * entries  # each slot's count when it was last credited
        self._last_raw = b""  # the slots at the last take(), when it credited them all
        self._credited: dict[CgroupErr, int] = {}  # per (cgroup, errno) of the living
        self._alive: Callable[[int], bool] = lambda _cgroup: True

    def take(self) -> dict[layout.FoldedName, int]:
        """What the slots counted since the last take, per name, then the next epoch if a
        fold window has passed: the current epoch's slots are read again next time."""
        new = self._unread(credit=True)
        for name, n in new.items():
            if self._alive(name[0]):
                pair = (name[0], name[3])
                self._credited[pair] = self._credited.get(pair, 0) + n
        self._next_epoch()
        return new

    def counts(self) -> dict[CgroupErr, int]:
        """Every fold so far per (cgroup, errno) of a cgroup not forgotten: the credited
        and the still unread."""
        out = dict(self._credited)
        for name, n in self._unread(credit=False).items():
            if self._alive(name[0]):
                pair = (name[0], name[3])
                out[pair] = out.get(pair, 0) + n
        return out

    def forget(self, keep: Callable[[int], bool]) -> int:
        """Drop the totals of every cgroup `keep` rejects; their unread folds still come
        with the next take(), and are not counted again. Returns how many went."""
        gone = [pair for pair in self._credited if not keep(pair[0])]
        for pair in gone:
            del self._credited[pair]
        self._alive = keep
        return len(gone)

    def close(self) -> None:
        self._slots.close()
        self._names.close()

    def _unread(self, *, credit: bool) -> dict[layout.FoldedName, int]:
        raw = self._slots[: self._entries * SLOT_SIZE]
        if raw == self._last_raw:
            return {}  # an idle node's take: one compare
        tags = memoryview(raw).cast("Q")[::2].tolist()
        folded = memoryview(raw).cast("I")[SLOT_WORDS - 1 :: SLOT_WORDS].tolist()
        out: dict[layout.FoldedName, int] = {}
        whole = True
        for i, (count, seen) in enumerate(zip(folded, self._seen, strict=True)):
            delta = (count - seen) & FOLDED_MASK
            if not delta:
                continue
            named = layout.FoldName.from_buffer_copy(self._names, i * NAME_SIZE)
            if named.tag != tags[i]:
                whole = False  # the probe is handing the slot to a new name: next time
                continue
            key = (named.cgroup_id, named.mntns, named.root_ino, named.err, named.filename)
            out[key] = out.get(key, 0) + delta
            if credit:
                self._seen[i] = count
        if credit:
            self._last_raw = raw if whole else b""
        return out

    def _next_epoch(self) -> None:
        """Every fold window: each CPU's next miss of each name is sent again, and slots of
        the epoch before the one ending now (read once more just now) may change names."""
        now = time.monotonic()
        if now - self._started < self._window_s:
            return
        clock = layout.FoldClock(epoch=self._clock.epoch + 1, harvested=self._clock.epoch)
        self._write_clock(clock)
        self._clock, self._started = clock, now


def _map(fd: int, size: int) -> mmap.mmap:
    return mmap.mmap(fd, -(-size // mmap.PAGESIZE) * mmap.PAGESIZE, mmap.MAP_SHARED, mmap.PROT_READ)
