"""`execwatch scan REF` against a real distribution registry (TLS, htpasswd), images pushed
with skopeo: the scan suite's cases, credentials, and a registry that fails."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.registry.registry_server import (
    CuttingProxy,
    Registry,
    TokenServer,
    running_registry,
)
from tests.support.scan.scan_cli import checks, scan_error, scan_json


def registry_args(registry: Registry, tmp_path: Path, *hosts: str) -> list[str]:
    auth = registry.auth_file(tmp_path / "auth.json", *hosts)
    return ["--registry-config", str(auth), "--registry-ca", str(registry.ca),
            "--cache-dir", str(tmp_path / "cache")]  # fmt: skip


def fetched(doc: dict[str, Any]) -> tuple[float, float, float]:
    """(over the network, from the cache, distinct layers) in MiB, from the registry note."""
    notes = [n for r in doc["images"] for n in r["notes"] if n.startswith("registry:")]
    (note,) = notes
    sizes = re.findall(r"([\d.]+) (MiB|B)", note)
    assert len(sizes) == 3, note
    return tuple(float(v) / (1 if u == "MiB" else 1 << 20) for v, u in sizes)  # type: ignore[return-value]


def test_multi_arch_index_scans_every_platform_and_finds_the_bad_one(
    registry: Registry, pushed: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, doc = scan_json(capsys, pushed["multi"], *registry_args(registry, tmp_path))
    assert [r["platform"] for r in doc["images"]] == [
        "linux/arm64",
        "linux/arm/v7",
        "linux/riscv64",
    ]
    assert code == 1
    bad = {f["platform"] for f in doc["findings"] if f["check"] == "arch-mismatch"}
    assert bad == {"linux/riscv64"}
    assert any(f["entrypoint"] and f["path"] == "/usr/bin/hello" for f in doc["findings"])
    digests = {n.split(" is ")[1] for r in doc["images"] for n in r["notes"] if " is sha256:" in n}
    assert len(digests) == 1  # every platform names the index it came from


def test_one_platform_of_an_index_and_a_platform_it_lacks(
    registry: Registry, pushed: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = registry_args(registry, tmp_path)
    code, doc = scan_json(capsys, pushed["multi"], "--platform", "linux/arm64", *args)
    assert [r["platform"] for r in doc["images"]] == ["linux/arm64"]
    assert (code, doc["findings"]) == (0, [])
    message = scan_error(capsys, pushed["multi"], "--platform", "linux/s390x", *args)
    assert (
        "no linux/s390x image (the input has: linux/arm/v7, linux/arm64, linux/riscv64)" in message
    )


def test_several_platforms_of_an_index_and_each_one_it_lacks(
    registry: Registry, pushed: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = registry_args(registry, tmp_path)
    platforms = ["--platform", "linux/riscv64", "--platform", "linux/arm64"]
    code, doc = scan_json(capsys, pushed["multi"], *platforms, *args)
    assert [r["platform"] for r in doc["images"]] == ["linux/riscv64", "linux/arm64"]
    bad = {f["platform"] for f in doc["findings"] if f["check"] == "arch-mismatch"}
    assert (code, bad) == (1, {"linux/riscv64"})
    network, _, layers = fetched(doc)
    # riscv64 carries arm64's layers, fetched once; arm/v7's own root was not asked for
    assert 0 < network < layers * 0.75, (network, layers)
    platforms = [
        "--platform",
        "linux/s390x",
        "--platform",
        "linux/arm64",
        "--platform",
        "linux/386",
    ]
    message = scan_error(capsys, pushed["multi"], *platforms, *args)
    assert "no linux/s390x and no linux/386 image (the input has: linux/arm/v7, " in message


def test_layers_are_fetched_once_and_a_repeat_scan_comes_from_the_cache(
    registry: Registry, pushed: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = registry_args(registry, tmp_path)
    _, first = scan_json(capsys, pushed["multi"], *args)
    network, cache, distinct = fetched(first)
    # over the network: the arm64 root, the armhf root and the shared layer, once each;
    # from the cache: the riscv64 entry's layers (the arm64 root) and the shared layer again
    assert network == pytest.approx(distinct, abs=0.1) and cache > 0.3 * network
    _, second = scan_json(capsys, pushed["multi"], *args)
    network2, cache2, _ = fetched(second)
    assert network2 < 0.01 and cache2 == pytest.approx(network + cache, rel=0.01)
    assert second["findings"] == first["findings"]


def test_glibc_binary_on_musl_image_in_docker_schema2(
    registry: Registry, pushed: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, doc = scan_json(capsys, pushed["musl"], *registry_args(registry, tmp_path))
    assert code == 1
    assert ("missing-interpreter", "/app") in checks(doc)


def test_whiteout_deleting_the_loader_and_a_digest_reference(
    registry: Registry, pushed: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = registry_args(registry, tmp_path)
    _, doc = scan_json(capsys, pushed["whiteout"], *args)
    assert ("missing-interpreter", "/usr/bin/hello") in checks(doc)
    said = [n for n in doc["images"][0]["notes"] if n.startswith(f"{pushed['whiteout']} is ")]
    assert len(said) == 1, doc["images"][0]["notes"]
    digest = said[0].split(" is ")[1]
    by_digest = pushed["whiteout"].rsplit(":", 1)[0] + "@" + digest
    _, again = scan_json(capsys, by_digest, *args)
    assert again["findings"] == doc["findings"]


def test_credentials_from_the_podman_auth_file_without_flags(
    registry: Registry, pushed: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    auth_dir = tmp_path / "run" / "containers"
    auth_dir.mkdir(parents=True)
    registry.auth_file(auth_dir / "auth.json")
    code, _ = scan_json(capsys, pushed["ready"], "--registry-ca", str(registry.ca))
    assert code == 0


def test_auth_failures_are_one_line(
    registry: Registry, pushed: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ca = ["--registry-ca", str(registry.ca)]
    assert "authentication failed anonymously" in scan_error(capsys, pushed["ready"], *ca)
    wrong = registry.auth_file(tmp_path / "wrong.json", password="not-it")
    message = scan_error(capsys, pushed["ready"], "--registry-config", str(wrong), *ca)
    assert f"authentication failed as ci (from {wrong})" in message


def test_tls_and_network_errors_are_one_line(
    registry: Registry, pushed: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    auth = str(registry.auth_file(tmp_path / "auth.json"))
    assert "TLS failure" in scan_error(capsys, pushed["ready"], "--registry-config", auth)
    plain = scan_error(
        capsys, pushed["ready"], "--registry-config", auth, "--insecure-registry", registry.host
    )
    assert "execwatch scan: error: " in plain
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{s.getsockname()[1]}"
    assert "connection refused by the registry" in scan_error(capsys, f"{closed}/team/ready:1")


@pytest.mark.parametrize(
    "ref",
    ["127.0.0.1:5000/Team/UPPER:1", "127.0.0.1:5000/team/app@sha256:abc", "localhost/a:b:c"],
)
def test_bad_references(ref: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert "not a valid image reference" in scan_error(capsys, ref)


def test_registry_that_drops_the_connection_mid_blob(
    registry: Registry, pushed: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    proxy = CuttingProxy(("127.0.0.1", registry.port), budget=256 << 10)
    try:
        ref = pushed["ready"].replace(registry.host, proxy.host)
        args = registry_args(registry, tmp_path, proxy.host)
        message = scan_error(capsys, ref, *args)
        assert proxy.cuts >= 1
        assert "connection to" in message or "content does not match" in message
    finally:
        proxy.close()
    blobs = tmp_path / "cache" / "blobs" / "sha256"
    assert not blobs.exists() or all(p.stat().st_size < 256 << 10 for p in blobs.iterdir())
    assert not list(blobs.glob(".part-*")) if blobs.exists() else True
    code, _ = scan_json(capsys, pushed["ready"], *registry_args(registry, tmp_path))
    assert code == 0


@pytest.fixture(scope="module")
def token_registry(
    registry: Registry, pushed: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Registry, Path, TokenServer]]:
    """A second registry on the same storage that wants bearer tokens from a token server."""
    work = tmp_path_factory.mktemp("token-registry")
    tokens = TokenServer(work / "issuer", registry.pki)
    try:
        options = {"storage": registry.workdir / "data", "token_realm": tokens.realm,
                   "token_cert": tokens.cert}  # fmt: skip
        with running_registry(work, **options) as reg:
            bundle = work / "cas.pem"
            bundle.write_text(registry.ca.read_text() + reg.ca.read_text())
            yield reg, bundle, tokens
    finally:
        tokens.close()


def test_bearer_tokens_from_the_registry_token_server(
    token_registry: tuple[Registry, Path, TokenServer], pushed: dict[str, str], registry: Registry,
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    reg, cas, tokens = token_registry
    ref = pushed["ready"].replace(registry.host, reg.host)
    ca = ["--registry-ca", str(cas), "--cache-dir", str(tmp_path / "cache")]
    auth = reg.auth_file(tmp_path / "auth.json")
    code, doc = scan_json(capsys, ref, "--registry-config", str(auth), *ca)
    assert (code, doc["findings"]) == (0, [])
    assert tokens.issued >= 1
    assert "authentication failed anonymously" in scan_error(capsys, ref, *ca)
    wrong = reg.auth_file(tmp_path / "wrong.json", password="not-it")
    message = scan_error(capsys, ref, "--registry-config", str(wrong), *ca)
    assert f"authentication failed as ci (from {wrong})" in message
