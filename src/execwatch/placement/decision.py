"""From per-container verdicts to what happens to one gated pod."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from execwatch.placement.affinity import Spec, narrowed_affinity, user_pin
from execwatch.runnable.verdict import Outcome


@dataclass(frozen=True)
class ContainerVerdict:
    """One container's image, judged per node architecture."""

    container: str
    image: str
    # architecture -> outcome: an image without that platform FAILS there, and UNKNOWN
    # (could not be told) never restricts the pod
    outcomes: Mapping[str, Outcome]
    why: Mapping[str, str] = field(default_factory=dict)  # architecture -> one line
    # architecture -> binaries that fail there but that the container does not start
    reported: Mapping[str, str] = field(default_factory=dict)
    # what the container starts that fails on every architecture (no #!, another OS's
    # binary): placement cannot help, the pod is left as it is, with a warning
    everywhere: str = ""

    def outcome(self, arch: str) -> Outcome:
        return self.outcomes.get(arch, Outcome.UNKNOWN)


class Action(enum.StrEnum):
    PLACE = "place"  # narrow the affinity to `arches`, lift the gate
    NOWHERE = "nowhere"  # no architecture works: a term no node matches, lift the gate
    LEAVE = "leave"  # lift the gate, change nothing (runs everywhere, or pinned by the user)


@dataclass(frozen=True)
class Decision:
    action: Action
    arches: tuple[str, ...]
    message: str
    warning: bool  # a Warning Event rather than a Normal one

    def affinity(self, spec: Spec) -> dict[str, Any] | None:
        if self.action is Action.LEAVE:
            return None
        return narrowed_affinity(spec, self.arches)


def decide(spec: Spec, verdicts: Sequence[ContainerVerdict], arches: Iterable[str]) -> Decision:
    """Where the pod may go among the cluster's node `arches`, and why."""
    cluster = sorted(set(arches))
    runs = [a for a in cluster if all(_starts(v.outcome(a)) for v in verdicts)]
    failing = {a: _first_failure(verdicts, a) for a in cluster if a not in runs}
    pin = user_pin(spec)
    decision = _everywhere(verdicts) or _decide(pin.pinned, pin.allows, cluster, runs, failing)
    also = _reported(verdicts, cluster)
    if not also:
        return decision
    return dataclasses.replace(decision, message=f"{decision.message}; not deciding: {also}")


def _everywhere(verdicts: Sequence[ContainerVerdict]) -> Decision | None:
    """A container that starts nothing any architecture runs: left unchanged, never
    narrowed nor held, with a Warning that names the file."""
    why = "; ".join(
        f"container {v.container!r} ({v.image}): {v.everywhere}" for v in verdicts if v.everywhere
    )
    if not why:
        return None
    return Decision(Action.LEAVE, (), f"fails on every node architecture, left as is: {why}", True)


def _decide(
    pinned: bool,
    allows: Callable[[str], bool],
    cluster: list[str],
    runs: list[str],
    failing: Mapping[str, str],
) -> Decision:
    if pinned:
        return _pinned(allows, cluster, failing)
    if not failing:
        return Decision(Action.LEAVE, tuple(cluster), "runs on every node architecture", False)
    why = "; ".join(f"{a}: {failing[a]}" for a in sorted(failing))
    if not runs:
        return Decision(Action.NOWHERE, (), f"runs on no node architecture: {why}", True)
    return Decision(Action.PLACE, tuple(runs), f"placed on {', '.join(runs)} only: {why}", False)


def _reported(verdicts: Sequence[ContainerVerdict], cluster: list[str]) -> str:
    """Failing binaries that the containers do not start: named, never deciding."""
    return "; ".join(
        f"{a}: container {v.container!r}: {v.reported[a]}"
        for a in cluster
        for v in verdicts
        if v.reported.get(a)
    )


def _pinned(
    allows: Callable[[str], bool], cluster: list[str], failing: Mapping[str, str]
) -> Decision:
    bad = [a for a in cluster if allows(a) and a in failing]
    if not bad:
        return Decision(Action.LEAVE, (), "the pod's own architecture choice runs", False)
    why = "; ".join(f"{a}: {failing[a]}" for a in bad)
    return Decision(Action.LEAVE, (), f"left as pinned, but fails on {why}", True)


def _starts(outcome: Outcome) -> bool:
    return outcome is not Outcome.FAILS


def _first_failure(verdicts: Sequence[ContainerVerdict], arch: str) -> str:
    for v in verdicts:
        if v.outcome(arch) is Outcome.FAILS:
            why = v.why.get(arch, "fails")
            return f"container {v.container!r} ({v.image}): {why}"
    return "fails"
