"""Expiry of ImageVerdicts on the real API server: unused for the TTL, or the least
recently used past the maximum count, deleted; the rest kept."""

from __future__ import annotations

import time

from kubernetes import client

from execwatch.placement.expiry import ExpiryConfig, VerdictExpiry, _entry
from execwatch.placement.verdicts import GROUP, PLURAL, VERSION, PlatformVerdict, VerdictStore
from execwatch.runnable.verdict import Outcome
from tests.placement.cluster import rest_for
from tests.placement.test_verdicts import crd, store

__all__ = ["crd", "store"]

DAY = 86400.0


def digest(i: int) -> str:
    return f"sha256:{i:064x}"


def written(store: VerdictStore, i: int, days_ago: float) -> None:
    """A verdict whose last use was `days_ago` (written with a clock set back)."""
    at = time.time() - days_ago * DAY
    old = VerdictStore(store.rest, lambda: at)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))
    old.record(digest(i), "r/app:1", [PlatformVerdict("linux/amd64", Outcome.RUNS, "scan", stamp)])


def names(admin: client.ApiClient) -> set[str]:
    items = client.CustomObjectsApi(admin).list_cluster_custom_object(GROUP, VERSION, PLURAL)
    return {i["spec"]["digest"] for i in items["items"]}


def test_a_verdict_unused_for_the_ttl_is_deleted_a_used_one_kept(
    store: VerdictStore, admin: client.ApiClient
) -> None:
    written(store, 1, days_ago=8)
    written(store, 2, days_ago=6)
    store.record(digest(3), "r/app:1", [])  # used now
    expiry = VerdictExpiry(rest_for(admin), ExpiryConfig(ttl=7 * DAY, page=1))

    assert expiry.sweep() == 1

    assert names(admin) == {digest(2), digest(3)}
    value = expiry.registry.get_sample_value("execwatch_verdicts_expired_total", {"why": "unused"})
    assert value == 1


def test_past_the_maximum_the_least_recently_used_go_first(
    store: VerdictStore, admin: client.ApiClient
) -> None:
    for i, age in enumerate([3.0, 1.0, 5.0, 2.0, 4.0]):
        written(store, i, days_ago=age)
    expiry = VerdictExpiry(rest_for(admin), ExpiryConfig(max_objects=2, page=2))

    assert expiry.sweep() == 3

    assert names(admin) == {digest(1), digest(3)}  # used 1 and 2 days ago


def test_a_verdict_written_since_the_list_is_kept(
    store: VerdictStore, admin: client.ApiClient
) -> None:
    written(store, 1, days_ago=30)
    expiry = VerdictExpiry(rest_for(admin), ExpiryConfig(page=1))
    listed = list(expiry._list())
    store.record(digest(1), "r/app:1", [])  # used again after the sweep listed it

    assert expiry._delete(_entry(listed[0]), "unused") == 0
    assert names(admin) == {digest(1)}
