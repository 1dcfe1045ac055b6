"""Placement decided by the scan engine, against the real registry and API server: an
image whose arm64 manifest carries x86-64 binaries goes to amd64 only; an honest
multi-arch image may go anywhere; an unreachable registry ungates the pod unchanged."""

from __future__ import annotations

from pathlib import Path

from kubernetes import client

from execwatch.audit.engine import ImageAuditor
from execwatch.cluster.rest import Rest
from execwatch.placement.affinity import ARCH_LABEL
from execwatch.placement.controller import Placer
from execwatch.placement.scanned import ScannedVerdicts
from execwatch.scan.limits import Limits
from execwatch.scan.registry import RegistryOptions
from tests.placement.cluster import create_pod, gates, namespace
from tests.placement.test_controller import Seen, events, required_terms, stored
from tests.registry.server import Registry
from tests.scan.imagebuild import Image, file, oci_layout
from tests.scan.test_checks import glibc_base

ARCHES = ("amd64", "arm64")


def placer(admin: client.ApiClient, registry: Registry, tmp_path: Path) -> Placer:
    options = RegistryOptions(
        config_files=[str(registry.auth_file(tmp_path / "auth.json"))],
        ca_file=str(registry.ca),
        cache_dir=str(tmp_path / "cache"),
    )
    auditor = ImageAuditor(options, Limits(), str(tmp_path / "verdicts"))
    return Placer(Rest(admin), ScannedVerdicts(auditor, lambda: ARCHES), lambda: ARCHES, Seen())


def liar(registry: Registry, built: dict[str, Path], host_glibc: dict[str, bytes], d: Path) -> str:
    """amd64 and arm64 in the index, x86-64 binaries in both: the manifest lies for arm64."""
    layers = [glibc_base(host_glibc), [file("usr/bin/server", built["glibc"].read_bytes())]]
    images = [Image(layers, arch, entrypoint=["/usr/bin/server"]) for arch in ARCHES]
    return registry.push(oci_layout(d, images), "team/liar:1")


def test_a_manifest_that_lies_for_arm64_is_placed_on_amd64_only(
    registered: object,
    admin: client.ApiClient,
    registry: Registry,
    built: dict[str, Path],
    host_glibc: dict[str, bytes],
    tmp_path: Path,
) -> None:
    image = liar(registry, built, host_glibc, tmp_path / "liar")
    ns = namespace(admin, "enforce")
    pod = create_pod(admin, ns, containers=[{"name": "app", "image": image}])

    outcome = placer(admin, registry, tmp_path).handle(pod)

    now = stored(admin, pod)
    assert outcome is not None and outcome.action == "place", outcome
    assert gates(now) == []
    assert required_terms(now) == [
        {"matchExpressions": [{"key": ARCH_LABEL, "operator": "In", "values": ["amd64"]}]}
    ]
    [(kind, reason, note)] = events(admin, now)
    assert (kind, reason) == ("Normal", "Placed")
    assert note.startswith("placed on amd64 only: arm64: container 'app'")
    assert "/usr/bin/server" in note


def test_an_honest_multi_arch_image_may_go_anywhere(
    registered: object,
    admin: client.ApiClient,
    registry: Registry,
    pushed: dict[str, str],
    tmp_path: Path,
) -> None:
    pod = create_pod(admin, namespace(admin, "enforce"), containers=[
        {"name": "app", "image": pushed["hello"]}])  # fmt: skip

    outcome = placer(admin, registry, tmp_path).handle(pod)

    now = stored(admin, pod)
    assert outcome is not None and outcome.action == "leave", outcome
    assert (gates(now), required_terms(now)) == ([], [])


def test_an_unreachable_registry_ungates_the_pod_unchanged(
    registered: object, admin: client.ApiClient, registry: Registry, tmp_path: Path
) -> None:
    pod = create_pod(admin, namespace(admin, "enforce"), containers=[
        {"name": "app", "image": "127.0.0.1:1/team/app:1"}])  # fmt: skip

    outcome = placer(admin, registry, tmp_path).handle(pod)

    now = stored(admin, pod)
    assert outcome is not None and outcome.action == "fail-open", outcome
    assert (gates(now), required_terms(now)) == ([], [])
    [(kind, reason, note)] = events(admin, now)
    assert (kind, reason) == ("Warning", "PlacementSkipped")
    assert note.startswith("placed without a verdict: ") and "127.0.0.1:1" in note
