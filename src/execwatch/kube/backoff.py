"""The one retry delay: exponential in the attempts, with a cap and jitter.

The step of attempt n (counted from 1) is ``initial * 2**(n-1)``, at most `cap`. The
delay is the step with one of two jitters:

- `Jitter.EQUAL`: uniform in [step/2, step]. Waits at least half the step, so a retry
  never comes back at once; the rest spreads retries of many clients apart. Used by
  every retry against the API server (workqueue, watch, publisher).
- `Jitter.FULL`: uniform in [0, step]. For writers that raced one another (a 409 on an
  update): the first to retry at once may well win, the rest spread out.
"""

from __future__ import annotations

import enum
import random

MAX_EXPONENT = 62  # 2**62 times any positive initial exceeds any cap; no float overflow


class Jitter(enum.Enum):
    EQUAL = "equal"
    FULL = "full"


def step(attempt: int, initial: float, cap: float) -> float:
    """initial * 2**(attempt-1), at most `cap` (attempt 0 or less counts as 1)."""
    exponent = min(MAX_EXPONENT, max(0, attempt - 1))
    return min(cap, initial * 2.0**exponent)


def delay(
    attempt: int,
    initial: float,
    cap: float,
    jitter: Jitter = Jitter.EQUAL,
    rng: random.Random | None = None,
) -> float:
    """Seconds to wait before retry `attempt` (see the module's docstring)."""
    top = step(attempt, initial, cap)
    low = top / 2 if jitter is Jitter.EQUAL else 0.0
    return rng.uniform(low, top) if rng is not None else random.uniform(low, top)
