"""User space's half of the kernel's per-cgroup budget (bpf/execwatch.h, "Fairness"): which
cgroup crowded the ring buffer, named once per sweep in the log and for the metrics.

The kernel counts every record it withholds per cgroup (`ew_budget.shed`) and in total
(stats `cgroup_budget`, exact). Each sweep compares the per-cgroup counts with the last
sweep's and names the cgroup that lost the most since then.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from execwatch.attribution.cgroup_layout import CgroupKind, parse_cgroup_path
from execwatch.attribution.mounts import cgroup_mounts
from execwatch.record import Attribution

log = logging.getLogger(__name__)

MAX_WALK = 50_000  # cgroup directories visited to name one cgroup
# A cgroup id -> what names it in the log: its path, and its pod when that is known.
Describe = Callable[[int], Mapping[str, str]]


@dataclass(frozen=True)
class Crowding:
    """The cgroup that had the most records withheld since the last sweep."""

    cgroup_id: int
    shed: int  # since the last sweep
    shed_total: int  # since its budget entry was made
    cgroups: int  # cgroups with records withheld since the last sweep, this one included


@dataclass
class ShedWatch:
    """Compares each sweep's per-cgroup shed counts with the last one's. Thread-safe: the
    counts pruner sweeps while a scrape names the top cgroup."""

    describe: Describe
    _seen: dict[int, int] = field(default_factory=dict)
    _names: dict[int, Mapping[str, str]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def name(self, cgroup_id: int) -> Mapping[str, str]:
        """describe(cgroup_id), once per cgroup while it keeps losing records."""
        with self._lock:
            known = self._names.get(cgroup_id)
        if known is None:
            known = self.describe(cgroup_id)
            with self._lock:
                self._names[cgroup_id] = known
        return known

    def sweep(self, shed: Mapping[int, int]) -> Crowding | None:
        """The cgroup that lost the most since the last sweep (logged), or None."""
        with self._lock:
            grown = {cg: n - self._seen.get(cg, 0) for cg, n in shed.items()}
            # An entry the LRU evicted and made anew starts again from 0.
            grown = {cg: d if d >= 0 else shed[cg] for cg, d in grown.items()}
            self._seen = {cg: n for cg, n in shed.items() if n}
            self._names = {cg: n for cg, n in self._names.items() if cg in self._seen}
        grown = {cg: d for cg, d in grown.items() if d > 0}
        if not grown:
            return None
        top = max(grown, key=lambda cg: grown[cg])
        found = Crowding(top, grown[top], shed[top], len(grown))
        log.warning(
            "a cgroup's failed execs went over its ring-buffer budget: records not sent "
            "(counts stay exact)",
            extra={"kv": {**self.name(top), **vars(found)}},
        )
        return found


def describe_cgroup(cgroup_id: int) -> dict[str, str]:
    """Its path in the cgroup v2 hierarchy, and the pod UID and container id that path
    holds when it is a Kubernetes container's."""
    path = cgroup_path(cgroup_id)
    if path is None:
        return {"cgroup": f"id:{cgroup_id}"}
    out = {"cgroup": path}
    layout = parse_cgroup_path(path)
    if layout.kind is CgroupKind.KUBERNETES:
        out |= {"pod_uid": layout.pod_uid or "", "container_id": layout.container_id or ""}
    return out


def with_pods(resolve: Callable[[int], Attribution]) -> Describe:
    """describe_cgroup, plus the namespace, pod and container attribution finds (pass
    Attributor.resolve)."""

    def describe(cgroup_id: int) -> dict[str, str]:
        out = describe_cgroup(cgroup_id)
        found = resolve(cgroup_id)
        named = {"namespace": found.namespace, "pod": found.pod, "container": found.container}
        return out | {k: v for k, v in named.items() if v}

    return describe


def cgroup_path(cgroup_id: int) -> str | None:
    """The cgroup v2 path of an id (its directory's inode), by a bounded walk; None when it
    is gone or not found."""
    unified = cgroup_mounts().unified
    if unified is None:
        return None
    with contextlib.suppress(OSError):
        if os.stat(unified.mountpoint).st_ino == cgroup_id:
            return unified.to_hierarchy_path(unified.mountpoint)
    todo, visited = deque([str(unified.mountpoint)]), 0
    while todo and visited < MAX_WALK:
        top = todo.popleft()
        visited += 1
        try:
            entries = list(os.scandir(top))
        except OSError:
            continue
        for entry in entries:
            if not entry.is_dir(follow_symlinks=False):
                continue
            if entry.inode() == cgroup_id:
                return unified.to_hierarchy_path(entry.path)
            todo.append(entry.path)
    return None
