"""Issue 34: what a registry can make a long-lived resolver (the placement controller) do.

Against the real registry and hostile ones on loopback: an index built to exhaust memory
fails within a bounded RSS, only the nodes' platforms are fetched, a registry dripping
bytes meets a hard deadline, no redirect of a manifest or a token is followed, a blob is
redirected to https only and still checked, a private destination is refused unless
allowed, a failure is named by its class, and content is reused only from the registry
and repository that served it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import ipaddress
import json
import os
import resource
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from execwatch.binfmt import Platform
from execwatch.runnable.errors import InputError
from execwatch.runnable.limits import Limits
from execwatch.scan.egress import Egress
from execwatch.scan.registry import (
    REDIRECT_REFUSED,
    REGISTRY_TIMED_OUT,
    Reference,
    RegistryClient,
    RegistryError,
    RegistryOptions,
    resolve_images,
)
from execwatch.scan.reuse import RegistryReuse
from tests.registry.hostile import (
    Answer,
    Dripping,
    Scripted,
    closing,
    loopback_pki,
    push_blob,
    push_manifest,
)
from tests.support.images.imagebuild import Image
from tests.support.kube.apiserver import REPO, free_port
from tests.support.registry.registry_server import HostileRegistry, Registry

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"
LOOPBACK = Egress((ipaddress.ip_network("127.0.0.0/8"),))  # what the tests' placement lists


def options(registry: Registry, tmp: Path, **more: Any) -> RegistryOptions:
    """The real registry's CA and credentials, a blob cache in `tmp`, loopback allowed."""
    tmp.mkdir(parents=True, exist_ok=True)
    auth = registry.auth_file(tmp / "auth.json")
    base = RegistryOptions(
        config_files=[str(auth)], ca_file=str(registry.ca), cache_dir=str(tmp / "cache")
    )
    return dataclasses.replace(base, **{"egress": LOOPBACK, **more})


def oci_image(config: bytes) -> tuple[bytes, str]:
    """A manifest of `config` and no layers, and the config's digest."""
    digest = "sha256:" + hashlib.sha256(config).hexdigest()
    desc = {"mediaType": OCI_CONFIG, "digest": digest, "size": len(config)}
    doc = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": desc, "layers": []}
    return json.dumps(doc).encode(), digest


def manifest(registry: Registry, repo: str, config: dict[str, object], n: int) -> dict[str, object]:
    """A one-layer OCI manifest of `config` (a descriptor), made distinct by `n`."""
    layer = push_blob(registry, repo, bytes(1024), OCI_LAYER)
    return {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": config, "layers": [layer],
            "annotations": {"n": str(n)}}  # fmt: skip


def index(
    registry: Registry, repo: str, tag: str, entries: list[tuple[str, dict[str, object]]]
) -> str:
    """An OCI index of one manifest per (platform, config descriptor); its reference."""
    descriptors = []
    for n, (platform, config) in enumerate(entries):
        doc = manifest(registry, repo, config, n)
        desc = push_manifest(registry, repo, f"m{n}", doc, OCI_MANIFEST)
        os_name, _, arch = platform.partition("/")
        descriptors.append({**desc, "platform": {"os": os_name, "architecture": arch}})
    top = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": descriptors}
    push_manifest(registry, repo, tag, top, OCI_INDEX)
    return f"{registry.host}/{repo}:{tag}"


# --- memory: bounded JSON, the nodes' platforms, bytes per resolution ------------------------


def test_an_index_of_16_manifests_sharing_a_4_mib_config_of_empty_objects_stays_small(
    registry: Registry, tmp_path: Path
) -> None:
    """Issue 34, reproduction 2: such an index took the controller from 147 MiB to
    1,594 MiB in 2 s, each manifest's copy of the config parsed in full. Registry JSON
    now goes through the token-bounded parser: the resolution fails on the first config,
    with one line, and the resolving process never grows past a few dozen MiB."""
    count = (Limits().max_json_bytes - 10) // 3
    empties = b'{"a":[' + b"{}," * count + b"{}]}"
    config = push_blob(registry, "bomb/config", empties, OCI_CONFIG)
    assert config["size"] <= Limits().max_json_bytes
    ref = index(registry, "bomb/config", "1", [("linux/amd64", config)] * 16)
    peak_mib, message = _resolve_in_a_process(registry, tmp_path, ref)
    assert "has more than 100000 JSON values" in message
    assert peak_mib < 160, f"the resolving process peaked at {peak_mib:.0f} MiB"


def _resolve_in_a_process(registry: Registry, tmp: Path, ref: str) -> tuple[float, str]:
    """resolve_images(ref) in a fresh Python limited to 1 GiB of address space: its peak
    RSS in MiB (its own VmHWM: a forked child's ru_maxrss counts the parent's pages), and
    what it printed (the error)."""
    auth = registry.auth_file(tmp / "auth.json")
    code = textwrap.dedent(f"""
        import re
        from execwatch.runnable.limits import Limits
        from execwatch.scan.registry import RegistryOptions, resolve_images
        options = RegistryOptions(config_files=[{str(auth)!r}], ca_file={str(registry.ca)!r},
                                  cache_bytes=0)
        try:
            resolve_images({ref!r}, options, Limits())
            print("resolved")
        except Exception as exc:
            print(exc)
        status = open("/proc/self/status").read()
        print(re.search(r"VmHWM:\\s+(\\d+) kB", status).group(1))
    """)
    gib = 1 << 30

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (gib, gib))

    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, preexec_fn=limit, env=env, check=False
    )
    lines = done.stdout.decode().strip().splitlines()
    assert len(lines) == 2 and lines[1].isdigit(), done.stdout + done.stderr
    return int(lines[1]) / 1024, lines[0]


@pytest.fixture(scope="module")
def platforms_index(registry: Registry) -> str:
    """amd64 with a real config; arm64 whose config is no JSON; three more whose configs
    are 3 MiB each (valid, a single long string)."""
    repo = "mixed/platforms"
    good = push_blob(registry, repo, json.dumps(Image([]).config()).encode(), OCI_CONFIG)
    broken = push_blob(registry, repo, b"not JSON at all", OCI_CONFIG)
    entries: list[tuple[str, dict[str, object]]] = [("linux/amd64", good), ("linux/arm64", broken)]
    for arch in ("riscv64", "s390x", "ppc64le"):
        big = json.dumps({"arch": arch, "padding": "x" * (3 << 20)}).encode()
        entries.append((f"linux/{arch}", push_blob(registry, repo, big, OCI_CONFIG)))
    return index(registry, repo, "1", entries)


def test_only_the_platforms_asked_for_are_fetched(
    registry: Registry, platforms_index: str, tmp_path: Path
) -> None:
    """Placement asks for its nodes' architectures: the arm64 entry, whose config is
    not even JSON, is never fetched when only amd64 is asked for."""
    amd64 = [Platform("linux", "amd64")]
    _, images, _ = resolve_images(platforms_index, options(registry, tmp_path), Limits(), amd64)
    assert [str(i.platform) for i in images] == ["linux/amd64"]
    with pytest.raises(InputError, match="is not valid JSON"):
        resolve_images(platforms_index, options(registry, tmp_path), Limits())


def test_the_bytes_of_manifests_and_configs_are_capped_per_resolution(
    registry: Registry, platforms_index: str, tmp_path: Path
) -> None:
    """Three 3 MiB configs are each within the JSON limit, and 9 MiB together past the
    8 MiB of one resolution."""
    asked = [Platform("linux", a) for a in ("riscv64", "s390x", "ppc64le")]
    with pytest.raises(InputError, match="manifests and configs larger than 8388608 bytes"):
        resolve_images(platforms_index, options(registry, tmp_path), Limits(), asked)


# --- time: a hard deadline per resolution ---------------------------------------------------


@pytest.mark.parametrize("where", ["handshake", "headers", "body"])
@pytest.mark.parametrize("pooled", [False, True], ids=["command-line", "placement"])
def test_a_registry_dripping_a_byte_every_half_second_meets_the_deadline(
    where: str, pooled: bool, tmp_path: Path
) -> None:
    """Issue 34, reproduction 3: one header byte every 0.5 s kept resolve() blocked for
    more than 40 s with a 2 s timeout, since each byte restarts a socket read's timeout.
    The resolution's deadline shuts its connections down: 2 s, whatever the registry
    does, and the failure says the registry timed out. A TLS registry whose handshake
    drips is shut down the same way. Placement's pooled sessions (a `HEAD` first) obey
    it as well."""
    reuse = RegistryReuse() if pooled else None
    tls = where == "handshake"  # a whole handshake is bounded by the timeout: a longer one
    with closing(Dripping(where)) as slow:
        ref = f"{slow.host}/slow/loris:1"
        opts = RegistryOptions(
            insecure=frozenset() if tls else frozenset({slow.host}),
            cache_bytes=0, timeout=20.0 if tls else 2.0, deadline=2.0,
            reuse=reuse, egress=LOOPBACK if pooled else None,
        )  # fmt: skip
        start = time.monotonic()
        with pytest.raises(RegistryError) as caught:
            resolve_images(ref, opts, Limits())
        took = time.monotonic() - start
        assert slow.closed_by_client.wait(2.0)
    assert took < 3.5, f"resolve_images returned after {took:.1f} s"
    assert REGISTRY_TIMED_OUT in str(caught.value)
    assert "Errno" not in str(caught.value)


# --- egress: no redirect for manifests or tokens, blobs to https only -----------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return loopback_pki(tmp_path_factory.mktemp("hostile-pki"))


def hostile_options(pki: Path) -> RegistryOptions:
    return RegistryOptions(ca_file=str(pki / "ca.crt"), cache_bytes=0, egress=LOOPBACK)


def test_a_tls_registrys_redirect_to_plain_http_on_loopback_is_not_followed(pki: Path) -> None:
    """Issue 34, item 6: a TLS registry's 302 was followed to a plain-HTTP
    `/latest/meta-data/…` on loopback. A manifest is asked of the registry only."""
    with closing(Scripted(lambda m, p: Answer(200, body=b"secret"))) as metadata:
        target = {"Location": f"{metadata.url}/latest/meta-data/iam"}
        registry = Scripted(lambda m, p: Answer(302, target), pki)
        with closing(registry), pytest.raises(RegistryError) as caught:
            resolve_images(f"{registry.host}/app/x:1", hostile_options(pki), Limits())
    assert REDIRECT_REFUSED in str(caught.value)
    assert metadata.asked == []


def test_a_token_realm_that_redirects_is_not_followed_and_no_token_goes_back(
    pki: Path,
) -> None:
    """Issue 34, item 6: a token realm redirecting to an internal token service sent that
    service's token back to the attacker's registry as a Bearer header. The token request
    is not redirected: the internal service is never asked, and the registry never gets
    a Bearer header."""
    internal_token = json.dumps({"token": "internal-secret"}).encode()
    with closing(Scripted(lambda m, p: Answer(200, body=internal_token), pki)) as internal:

        def registry_answer(method: str, path: str) -> Answer:
            if path.startswith("/token"):
                return Answer(302, {"Location": f"{internal.url}/token"})
            realm = f'Bearer realm="{registry.url}/token",service="evil"'
            return Answer(401, {"WWW-Authenticate": realm})

        with closing(Scripted(registry_answer, pki)) as registry:
            with pytest.raises(RegistryError) as caught:
                resolve_images(f"{registry.host}/app/x:1", hostile_options(pki), Limits())
            sent = [a.authorization for a in registry.asked]
    assert REDIRECT_REFUSED in str(caught.value)
    assert internal.asked == []
    assert not [header for header in sent if "Bearer" in header]


def test_a_redirect_to_a_closed_port_puts_no_socket_error_in_the_message(pki: Path) -> None:
    """Issue 34, item 6: a redirect to a closed port put `Connection refused` in the
    Event, a port scanner. A manifest's redirect is refused before any connection; a
    blob's, to https, is followed and fails by class, never with the socket's words."""
    closed = free_port()
    top, config_digest = oci_image(json.dumps(Image([]).config()).encode())

    def answer(method: str, path: str) -> Answer:
        if "/manifests/" in path:
            return Answer(200, {"Content-Type": OCI_MANIFEST}, top)
        return Answer(302, {"Location": f"https://127.0.0.1:{closed}/blob/{config_digest}"})

    with closing(Scripted(answer, pki)) as registry:
        ref = f"{registry.host}/app/x:1"
        with pytest.raises(RegistryError) as blob:
            resolve_images(ref, hostile_options(pki), Limits())
    elsewhere = {"Location": f"http://127.0.0.1:{closed}/"}
    registry = Scripted(lambda m, p: Answer(302, elsewhere), pki)
    with closing(registry), pytest.raises(RegistryError) as manifest:
        resolve_images(f"{registry.host}/app/x:1", hostile_options(pki), Limits())
    assert REDIRECT_REFUSED in str(manifest.value)
    assert "connection refused by the registry" in str(blob.value)
    for message in (str(blob.value), str(manifest.value)):
        assert "Connection refused" not in message and "Errno" not in message
        assert str(closed) not in message


@pytest.mark.parametrize(
    ("scheme", "served", "expected"),
    [
        ("https", "right", None),
        ("https", "wrong", "content does not match its digest"),
        ("http", "right", "redirected it to a non-https address"),
    ],
)
def test_a_blob_is_redirected_to_https_only_and_still_checked_against_its_digest(
    pki: Path, scheme: str, served: str, expected: str | None
) -> None:
    """Object storage behind a registry: a blob may be redirected, to https only, once,
    and the bytes that come back are checked against the digest all the same."""
    config = json.dumps(Image([]).config()).encode()
    body = config if served == "right" else config.replace(b"a", b"b", 1)  # the same size
    storage = Scripted(lambda m, p: Answer(200, body=body), pki if scheme == "https" else None)
    top, _ = oci_image(config)

    def answer(method: str, path: str) -> Answer:
        if "/manifests/" in path:
            return Answer(200, {"Content-Type": OCI_MANIFEST}, top)
        return Answer(307, {"Location": f"{storage.url}/bucket/object"})

    with closing(storage), closing(Scripted(answer, pki)) as registry:
        ref = f"{registry.host}/app/x:1"
        if expected is None:
            _, images, _ = resolve_images(ref, hostile_options(pki), Limits())
            assert images[0].config == json.loads(config)
        else:
            with pytest.raises(RegistryError, match=expected):
                resolve_images(ref, hostile_options(pki), Limits())
    assert len(storage.asked) == (0 if scheme == "http" else 1)


def test_a_private_destination_not_listed_is_refused_before_any_connection(
    registry: Registry, tmp_path: Path
) -> None:
    """Loopback, link-local and private addresses are refused unless listed
    (placement.registry.allowPrivate): the real registry on 127.0.0.1 works when
    127.0.0.0/8 is listed, and is never connected to otherwise, by address or by name."""
    slow = Dripping("headers")  # counts connections, answers none
    try:
        for host in (slow.host, slow.host.replace("127.0.0.1", "localhost")):
            ref = f"{host}/app/x:1"
            opts = RegistryOptions(insecure=frozenset({host}), cache_bytes=0, egress=Egress())
            with pytest.raises(RegistryError, match="destination refused: loopback address"):
                resolve_images(ref, opts, Limits())
        assert slow.accepted == 0
    finally:
        slow.close()
    only_private = Egress((ipaddress.ip_network("10.0.0.0/8"),))
    opts = options(registry, tmp_path, egress=only_private)
    with pytest.raises(RegistryError, match="destination refused: loopback address"):
        resolve_images(f"{registry.host}/team/x:1", opts, Limits())


# --- reuse: by registry, repository and digest ----------------------------------------------


@pytest.fixture
def private_seen(
    registry: Registry, pushed: dict[str, str], tmp_path: Path
) -> Iterator[tuple[RegistryReuse, str, RegistryClient]]:
    """The private image `hello` resolved with its credentials: the memo and the blob
    cache hold its manifests, configs and one layer."""
    reuse = RegistryReuse()
    opts = options(registry, tmp_path / "victim", reuse=reuse)
    client, images, digest = resolve_images(pushed["hello"], opts, Limits())
    with images[0].layers[0].open() as f:
        while f.read(1 << 20):
            pass
    yield reuse, digest, client
    reuse.close()


def test_a_registry_answering_head_with_a_private_digest_gets_nothing_from_the_memo(
    private_seen: tuple[RegistryReuse, str, RegistryClient], tmp_path: Path
) -> None:
    """Issue 34, item 8: the memo was keyed by digest only, so a registry the attacker runs
    could answer HEAD with a private image's digest and have it judged from the memo.
    Content is now kept per registry and repository: the attacker's registry must serve
    the bytes itself, which it cannot."""
    reuse, digest, victim = private_seen
    top, _ = victim.manifest(digest)
    first, _ = victim.manifest(top["manifests"][0]["digest"])
    naming_its_config = {**first, "layers": []}  # the attacker's own manifest
    hostile = HostileRegistry()
    try:
        hostile.heads["evil/app/1"] = digest
        body = json.dumps(naming_its_config).encode()
        by_digest = "sha256:" + hashlib.sha256(body).hexdigest()
        for ref in ("2", by_digest):
            hostile.manifests[f"evil/app/{ref}"] = (OCI_MANIFEST, body)
        opts = RegistryOptions(
            insecure=frozenset({hostile.host}), cache_bytes=0, reuse=reuse, egress=LOOPBACK
        )
        for tag in ("1", "2"):
            with pytest.raises(RegistryError, match=r"HTTP 404"):
                resolve_images(f"{hostile.host}/evil/app:{tag}", opts, Limits())
        assert f"/v2/evil/app/manifests/{digest}" in hostile.requested
        assert f"/v2/evil/app/blobs/{first['config']['digest']}" in hostile.requested
    finally:
        hostile.close()


def test_a_blob_in_the_cache_is_served_only_to_the_repository_that_served_it(
    private_seen: tuple[RegistryReuse, str, RegistryClient], tmp_path: Path
) -> None:
    """The blob cache on disk is keyed by registry and repository too: another
    repository naming a cached layer's digest is asked for the layer itself."""
    victim = private_seen[2]
    layer_digest = next(iter(victim.stats.layer_bytes))
    size = victim.stats.layer_bytes[layer_digest]
    hostile = HostileRegistry()
    try:
        opts = RegistryOptions(
            insecure=frozenset({hostile.host}),
            cache_dir=victim.cache.root.removesuffix("/blobs") if victim.cache else None,
            egress=LOOPBACK,
        )
        attacker = RegistryClient(Reference.parse(f"{hostile.host}/evil/app:1"), opts, Limits())
        with pytest.raises(RegistryError, match=r"HTTP 404"):
            attacker.open_blob(layer_digest, size)
        assert f"/v2/evil/app/blobs/{layer_digest}" in hostile.requested
    finally:
        hostile.close()
