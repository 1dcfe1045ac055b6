"""The one token bucket: what paces the agent's creates and the handler's evictions.

Kept by hand, not taken from a rate-limit library: `limits`' memory storage and
pyrate-limiter's in-memory buckets each run a background thread (a Timer, a Leaker),
keep one entry per request taken rather than two numbers, and read the wall clock
instead of an injected one, which the tests of both callers drive. Not thread-safe:
each caller holds its own lock (the publisher's) or runs on one thread (the mitigator).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class TokenBucket:
    """`rate` tokens a second, at most `burst` kept; full at the start."""

    rate: float
    burst: int
    clock: Callable[[], float]
    tokens: float = field(init=False)
    stamp: float = field(init=False)

    def __post_init__(self) -> None:
        self.tokens = float(self.burst)
        self.stamp = self.clock()

    def wait_time(self) -> float:
        """Seconds until a token is there (0: take one now; inf: at rate 0, never)."""
        now = self.clock()
        self.tokens = min(float(self.burst), self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1:
            return 0.0
        return (1 - self.tokens) / self.rate if self.rate > 0 else math.inf

    def take(self) -> None:
        """Spend one token; call it after wait_time() said 0."""
        self.tokens -= 1

    def try_take(self) -> bool:
        """Spend one token if there is one now."""
        if self.wait_time() > 0:
            return False
        self.take()
        return True
