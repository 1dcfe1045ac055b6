"""The one vocabulary for whether an image runs on one architecture: `execwatch audit`'s
report and placement's ImageVerdicts, webhook answers and metrics both speak it.

Values are stable: they are the ImageVerdict CRD's `outcome` enum and placement's metric
labels. The audit report spells the same outcomes in its own words (audit/report.py)."""

from __future__ import annotations

import enum
from collections.abc import Iterable


class Outcome(enum.StrEnum):
    """What the binaries an image starts do on one architecture, least bad first: the
    outcome of several (a workload's containers) is the worst of theirs (`worst`)."""

    RUNS = "runs"
    EMULATED = "emulated"  # runs, slowly, through a binfmt_misc emulator on such nodes
    MISSING_PLATFORM = "missing-platform"  # the image index has no manifest for it
    FAILS = "fails"
    UNKNOWN = "unknown"  # could not be told (the image could not be checked)

    @property
    def rank(self) -> int:
        """The order of badness: RUNS 0 ... UNKNOWN 4."""
        return list(Outcome).index(self)


def worst(outcomes: Iterable[Outcome], default: Outcome = Outcome.RUNS) -> Outcome:
    """The worst of `outcomes` (UNKNOWN over FAILS over ... RUNS); `default` if none."""
    return max(outcomes, key=lambda o: o.rank, default=default)
