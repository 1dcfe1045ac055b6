"""What a long-lived process keeps between registry requests (scan.reuse), against the real
registry behind a proxy that counts what it is asked and the connections it accepts: a
digest seen before costs one HEAD of the tag over a kept connection, a moved tag is
followed, a token is kept for its credential only, a forked scan opens its own
connections, and every store stays within its bounds."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from execwatch.runnable.limits import Limits
from execwatch.scan.isolated import ProcessLimits, run_isolated
from execwatch.scan.registry import RegistryError, RegistryOptions, registry_images
from execwatch.scan.reuse import (
    AuthCache,
    Content,
    ContentMemo,
    RegistryReuse,
    SessionPool,
    token_ttl,
)
from tests.support.images.imagebuild import Image, file, oci_layout
from tests.support.registry.counting_proxy import CountingProxy
from tests.support.registry.registry_server import (
    PASSWORD,
    USER,
    Registry,
    TokenRegistry,
    running_token_registry,
)


@pytest.fixture
def proxy(registry: Registry) -> Iterator[CountingProxy]:
    made = CountingProxy(registry)
    yield made
    made.close()


@pytest.fixture(scope="module")
def tokened(
    registry: Registry, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TokenRegistry]:
    """A registry on the same storage that wants bearer tokens from a token server."""
    with running_token_registry(registry, tmp_path_factory.mktemp("token-registry")) as made:
        yield made


def options(
    registry: Registry, tmp: Path, reuse: RegistryReuse, *hosts: str, password: str = PASSWORD
) -> RegistryOptions:
    """The registry's CA, credentials for `hosts` (none: anonymous), a blob cache in `tmp`."""
    tmp.mkdir(parents=True, exist_ok=True)
    auth = tmp / "auth.json"
    files = [str(registry.auth_file(auth, *hosts, password=password))] if hosts else []
    return RegistryOptions(
        config_files=files, ca_file=str(registry.ca), cache_dir=str(tmp / "cache"), reuse=reuse
    )


def tiny(registry: Registry, tmp: Path, repo_tag: str, text: str) -> str:
    """Push a two-platform image whose one file holds `text`: a new digest each `text`."""
    images = [Image([[file("etc/id", text.encode(), 0o644)]], arch) for arch in ("amd64", "arm64")]
    return registry.push(oci_layout(tmp / f"layout-{text}", images), repo_tag)


def test_a_digest_seen_before_costs_one_head_of_its_tag_over_a_kept_connection(
    registry: Registry, pushed: dict[str, str], proxy: CountingProxy, tmp_path: Path
) -> None:
    ref = pushed["hello"].replace(registry.host, proxy.host)
    opts = options(registry, tmp_path, RegistryReuse(), proxy.host)

    first = registry_images(ref, opts, Limits())
    platforms = [image.digest for image in first.images]
    fetched = proxy.asked("manifests")
    proxy.reset()
    second = registry_images(ref, opts, Limits())

    assert len(platforms) == 2
    for digest in [first.digest, *platforms]:
        assert ("GET", f"/v2/team/hello/manifests/{digest}") in fetched
    assert proxy.asked() == [("HEAD", "/v2/team/hello/manifests/2")]
    assert proxy.connections == 0  # the first resolution's connection, kept
    assert second.digest == first.digest
    assert [(i.digest, i.config) for i in second.images] == [
        (i.digest, i.config) for i in first.images
    ]


def test_without_reuse_every_resolution_fetches_every_manifest(
    registry: Registry, pushed: dict[str, str], proxy: CountingProxy, tmp_path: Path
) -> None:
    ref = pushed["hello"].replace(registry.host, proxy.host)
    opts = dataclasses.replace(options(registry, tmp_path, RegistryReuse(), proxy.host), reuse=None)

    registry_images(ref, opts, Limits())
    proxy.reset()
    again = registry_images(ref, opts, Limits())

    gets = {p for m, p in proxy.asked("manifests") if m == "GET"}
    assert len(gets) == 1 + len(again.images)  # the tag, then each platform by digest
    assert proxy.connections > 1


def test_a_moved_tag_is_followed(registry: Registry, proxy: CountingProxy, tmp_path: Path) -> None:
    reuse = RegistryReuse()
    opts = options(registry, tmp_path, reuse, proxy.host)
    ref = tiny(registry, tmp_path, "team/moving:1", "one").replace(registry.host, proxy.host)
    before = registry_images(ref, opts, Limits())

    tiny(registry, tmp_path, "team/moving:1", "two")
    proxy.reset()
    after = registry_images(ref, opts, Limits())

    assert after.digest != before.digest
    assert {i.digest for i in after.images}.isdisjoint({i.digest for i in before.images})
    assert ("GET", f"/v2/team/moving/manifests/{after.digest}") in proxy.asked()
    fresh = registry_images(ref, dataclasses.replace(opts, reuse=None), Limits())
    assert fresh.digest == after.digest


def test_a_token_is_kept_for_its_credential_and_never_sent_for_another(
    registry: Registry, pushed: dict[str, str], tokened: TokenRegistry, tmp_path: Path
) -> None:
    served, tokens, reuse = tokened.registry, tokened.tokens, RegistryReuse()
    ref = pushed["hello"].replace(registry.host, served.host)
    good = options(served, tmp_path / "good", reuse, served.host)
    registry_images(ref, good, Limits())
    issued = tokens.issued

    registry_images(ref, good, Limits())
    assert tokens.issued == issued  # kept

    with pytest.raises(RegistryError, match="authentication failed anonymously"):
        registry_images(ref, options(served, tmp_path / "none", reuse), Limits())
    assert tokens.issued == issued + 1  # its own token, which grants nothing

    wrong = options(served, tmp_path / "wrong", reuse, served.host, password="nope")
    with pytest.raises(RegistryError, match=f"authentication failed as {USER}"):
        registry_images(ref, wrong, Limits())
    assert tokens.issued == issued + 1  # the token server refused the wrong password

    registry_images(ref, good, Limits())
    assert tokens.issued == issued + 1  # the good credential's token, still kept
    key = (served.host, "team/hello", reuse.credential_key(USER, PASSWORD))
    assert (reuse.auth.get(key) or "").startswith("Bearer ")
    assert reuse.credential_key(USER, "nope") != key[2] and reuse.credential_key(None, None) == ""


def test_a_refused_kept_token_is_replaced(
    registry: Registry, pushed: dict[str, str], tokened: TokenRegistry, tmp_path: Path
) -> None:
    served, tokens, reuse = tokened.registry, tokened.tokens, RegistryReuse()
    key = (served.host, "team/hello", reuse.credential_key(USER, PASSWORD))
    reuse.auth.put(key, "Bearer revoked-or-expired", 60.0)
    issued = tokens.issued

    got = registry_images(
        pushed["hello"].replace(registry.host, served.host),
        options(served, tmp_path, reuse, served.host),
        Limits(),
    )

    assert len(got.images) == 2 and tokens.issued == issued + 1
    assert reuse.auth.get(key) not in (None, "Bearer revoked-or-expired")


def test_a_forked_scan_opens_its_own_connection_and_leaves_the_kept_one_intact(
    registry: Registry, pushed: dict[str, str], proxy: CountingProxy, tmp_path: Path
) -> None:
    ref = pushed["hello"].replace(registry.host, proxy.host)
    opts = dataclasses.replace(
        options(registry, tmp_path, RegistryReuse(), proxy.host), cache_bytes=0
    )
    got = registry_images(ref, opts, Limits())
    layer = got.images[0].layers[-1]
    assert layer.size is not None
    proxy.reset()

    def read_layer() -> int:
        with layer.open() as f:
            return len(f.read())

    size = run_isolated(read_layer, ProcessLimits(wall_s=60), "layer")
    assert size == layer.size
    assert proxy.connections == 1  # the child's own
    proxy.reset()
    registry_images(ref, opts, Limits())
    assert proxy.connections == 0 and len(proxy.asked()) == 1  # the parent's, still good


def test_the_memo_holds_at_most_its_entries_and_still_answers(
    registry: Registry, pushed: dict[str, str], proxy: CountingProxy, tmp_path: Path
) -> None:
    reuse = RegistryReuse(memo=ContentMemo(max_entries=2))
    ref = pushed["hello"].replace(registry.host, proxy.host)
    opts = options(registry, tmp_path, reuse, proxy.host)

    first = registry_images(ref, opts, Limits())  # index, 2 manifests, 2 configs
    assert len(reuse.memo) == 2
    proxy.reset()
    again = registry_images(ref, opts, Limits())

    assert len(reuse.memo) == 2
    assert [i.digest for i in again.images] == [i.digest for i in first.images]
    assert len(proxy.asked("manifests")) > 1  # what was evicted is fetched again


def test_the_memo_is_bounded_in_bytes_and_keeps_the_most_recently_used() -> None:
    memo = ContentMemo(max_entries=100, max_bytes=1000)
    for i in range(20):
        memo.put(f"sha256:{i:064x}", Content(bytes(100), ""))
        memo.get(f"sha256:{0:064x}")  # kept in use
    memo.put(f"sha256:{99:064x}", Content(bytes(126), ""))  # over an eighth: never kept

    assert memo.bytes <= 1000 and len(memo) == 10
    assert memo.get(f"sha256:{0:064x}") is not None
    assert memo.get(f"sha256:{1:064x}") is None and memo.get(f"sha256:{99:064x}") is None


def test_the_auth_cache_is_bounded_and_forgets_what_expired() -> None:
    now = [0.0]
    cache = AuthCache(max_entries=3, clock=lambda: now[0])
    for i in range(5):
        cache.put(("r", f"repo{i}", "who"), f"Bearer {i}", 50.0)
    assert len(cache) == 3 and cache.get(("r", "repo0", "who")) is None
    assert cache.get(("r", "repo4", "who")) == "Bearer 4"
    assert cache.get(("r", "repo4", "someone else")) is None
    now[0] = 50.0
    assert cache.get(("r", "repo4", "who")) is None
    assert token_ttl(300) == 290.0 and token_ttl(None) == 50.0 and token_ttl("x") == 50.0
    assert token_ttl(5) < 0 and token_ttl(True) == 50.0  # too short to be kept


def test_the_session_pool_is_bounded_and_keeps_the_most_recently_used() -> None:
    pool = SessionPool(max_sessions=2, connections=2)
    first = pool.get(("r", "a"))
    pool.get(("r", "b"))
    assert pool.get(("r", "a")) is first
    pool.get(("r", "c"))  # "b" is the least recently used
    assert len(pool) == 2 and pool.get(("r", "a")) is first
    pool.close()
    assert len(pool) == 0
