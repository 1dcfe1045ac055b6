"""The one token bucket (execwatch.kube.ratelimit), on a clock the test moves."""

from __future__ import annotations

import math

from execwatch.kube.ratelimit import TokenBucket


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_full_bucket_gives_its_burst_at_once_then_waits_for_the_rate() -> None:
    clock = Clock()
    bucket = TokenBucket(rate=2.0, burst=3, clock=clock)
    assert [bucket.try_take() for _ in range(4)] == [True, True, True, False]
    assert bucket.wait_time() == 0.5  # one token at 2 a second
    clock.now += 0.5
    assert bucket.try_take() and not bucket.try_take()


def test_a_long_pause_refills_no_more_than_the_burst() -> None:
    clock = Clock()
    bucket = TokenBucket(rate=10.0, burst=2, clock=clock)
    assert bucket.try_take() and bucket.try_take()
    clock.now += 3600
    assert [bucket.try_take() for _ in range(3)] == [True, True, False]


def test_wait_time_then_take_is_try_take() -> None:
    clock = Clock()
    bucket = TokenBucket(rate=1.0, burst=1, clock=clock)
    assert bucket.wait_time() == 0.0
    bucket.take()
    assert bucket.wait_time() == 1.0
    clock.now += 0.25
    assert bucket.wait_time() == 0.75


def test_at_rate_zero_the_burst_is_all_there_ever_is() -> None:
    clock = Clock()
    bucket = TokenBucket(rate=0.0, burst=1, clock=clock)
    assert bucket.try_take()
    clock.now += 1e6
    assert not bucket.try_take() and bucket.wait_time() == math.inf
