"""The one retry delay (execwatch.kube.backoff): its bounds, as a specification."""

from __future__ import annotations

import random

import pytest

from execwatch.kube import backoff
from execwatch.kube.backoff import Jitter


def test_the_step_doubles_from_initial_up_to_the_cap() -> None:
    assert [backoff.step(n, 0.5, 30.0) for n in range(1, 9)] == [
        0.5,
        1.0,
        2.0,
        4.0,
        8.0,
        16.0,
        30.0,
        30.0,
    ]


def test_attempt_zero_or_less_is_the_first_step() -> None:
    assert backoff.step(0, 0.5, 30.0) == backoff.step(-3, 0.5, 30.0) == 0.5


def test_a_huge_attempt_count_stays_at_the_cap_without_overflow() -> None:
    assert backoff.step(10**6, 0.5, 30.0) == 30.0
    assert backoff.delay(10**6, 0.5, 30.0) <= 30.0


@pytest.mark.parametrize("attempt", [1, 2, 5, 12, 40])
def test_equal_jitter_waits_between_half_the_step_and_the_step(attempt: int) -> None:
    rng = random.Random(attempt)
    top = backoff.step(attempt, 0.25, 10.0)
    delays = [backoff.delay(attempt, 0.25, 10.0, Jitter.EQUAL, rng) for _ in range(2000)]
    assert all(top / 2 <= d <= top for d in delays)
    assert min(delays) < top * 0.55 and max(delays) > top * 0.95  # spread over the range


@pytest.mark.parametrize("attempt", [1, 3, 9])
def test_full_jitter_waits_between_zero_and_the_step(attempt: int) -> None:
    rng = random.Random(attempt)
    top = backoff.step(attempt, 0.01, 0.2)
    delays = [backoff.delay(attempt, 0.01, 0.2, Jitter.FULL, rng) for _ in range(2000)]
    assert all(0.0 <= d <= top for d in delays)
    assert min(delays) < top * 0.05 and max(delays) > top * 0.95


def test_equal_jitter_is_the_default() -> None:
    assert all(1.0 <= backoff.delay(2, 1.0, 5.0) <= 2.0 for _ in range(500))
