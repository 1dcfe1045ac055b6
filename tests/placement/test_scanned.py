"""Placement decided by the scan engine, against the real registry and API server.

The registry requires credentials; the controller pulls only with the pod's own
imagePullSecrets and its ServiceAccount's. What decides is what the pod starts: its
`command`/`args`, else the image's entrypoint, and the first word of an `sh -c`."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from execwatch.cluster.rest import Rest
from execwatch.placement.affinity import ARCH_LABEL
from execwatch.placement.controller import Placer
from execwatch.placement.pullsecrets import PullSecrets
from execwatch.placement.scanned import ScannedVerdicts
from execwatch.runnable.limits import Limits
from execwatch.scan.registry import RegistryOptions
from tests.placement.cluster import create_pod, gates, namespace
from tests.placement.test_controller import Seen, events, required_terms, stored
from tests.registry.fixtures import arm64_root
from tests.registry.server import PASSWORD, USER, Registry
from tests.scan.imagebuild import Image, file, oci_layout, symlink
from tests.scan.test_checks import glibc_base

ARCHES = ("amd64", "arm64")
AMD64_ONLY = [{"matchExpressions": [{"key": ARCH_LABEL, "operator": "In", "values": ["amd64"]}]}]


def placer(admin: client.ApiClient, registry: Registry, tmp: Path, strict: bool = False) -> Placer:
    options = RegistryOptions(ca_file=str(registry.ca), cache_dir=str(tmp / "cache"))
    rest = Rest(admin)
    source = ScannedVerdicts(PullSecrets(rest), options, Limits(), lambda: ARCHES, strict)
    return Placer(rest, source, lambda: ARCHES, Seen())


def pull_secret(
    admin: client.ApiClient, ns: str, registry: Registry, password: str = PASSWORD
) -> str:
    auth = base64.b64encode(f"{USER}:{password}".encode()).decode()
    config = json.dumps({"auths": {registry.host: {"auth": auth}}}).encode()
    client.CoreV1Api(admin).create_namespaced_secret(ns, {
        "metadata": {"name": "pull"},
        "type": "kubernetes.io/dockerconfigjson",
        "data": {".dockerconfigjson": base64.b64encode(config).decode()},
    })  # fmt: skip
    return "pull"


def enforced(admin: client.ApiClient, registry: Registry) -> tuple[str, list[dict[str, str]]]:
    ns = namespace(admin, "enforce")
    return ns, [{"name": pull_secret(admin, ns, registry)}]


def liar(registry: Registry, built: dict[str, Path], host_glibc: dict[str, bytes], d: Path) -> str:
    """amd64 and arm64 in the index, x86-64 binaries in both: the manifest lies for arm64."""
    layers = [glibc_base(host_glibc), [file("usr/bin/server", built["glibc"].read_bytes())]]
    images = [Image(layers, arch, entrypoint=["/usr/bin/server"]) for arch in ARCHES]
    return registry.push(oci_layout(d, images), "team/liar:1")


@pytest.fixture(scope="module")
def toolbox(
    registry: Registry,
    built: dict[str, Path],
    host_glibc: dict[str, bytes],
    foreign_root: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> str:
    """An honest entrypoint on both platforms (/usr/bin/server, /usr/bin/sh), but a helper
    /usr/bin/tool that is x86-64 in the arm64 image too."""
    x86 = built["glibc"].read_bytes()
    arm64_hello = (foreign_root / "arm64" / "root" / "usr" / "bin" / "hello").read_bytes()
    tool = [file("usr/bin/tool", x86)]
    amd64 = Image(
        [glibc_base(host_glibc), [file("usr/bin/server", x86), file("usr/bin/sh", x86), *tool]],
        "amd64", entrypoint=["/usr/bin/server"],
    )  # fmt: skip
    arm64 = Image(
        [arm64_root(foreign_root),
         [file("usr/bin/server", arm64_hello), symlink("usr/bin/sh", "busybox"), *tool]],
        "arm64", entrypoint=["/usr/bin/server"],
    )  # fmt: skip
    layout = oci_layout(tmp_path_factory.mktemp("toolbox"), [amd64, arm64])
    return registry.push(layout, "team/toolbox:1")


def test_a_manifest_that_lies_for_arm64_is_placed_on_amd64_only(
    registered: object,
    admin: client.ApiClient,
    registry: Registry,
    built: dict[str, Path],
    host_glibc: dict[str, bytes],
    tmp_path: Path,
) -> None:
    image = liar(registry, built, host_glibc, tmp_path / "liar")
    ns, secrets = enforced(admin, registry)
    pod = create_pod(admin, ns, imagePullSecrets=secrets, containers=[
        {"name": "app", "image": image}])  # fmt: skip

    outcome = placer(admin, registry, tmp_path).handle(pod)

    now = stored(admin, pod)
    assert outcome is not None and outcome.action == "place", outcome
    assert gates(now) == []
    assert required_terms(now) == AMD64_ONLY
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
    ns, secrets = enforced(admin, registry)
    pod = create_pod(admin, ns, imagePullSecrets=secrets, containers=[
        {"name": "app", "image": pushed["hello"]}])  # fmt: skip

    outcome = placer(admin, registry, tmp_path).handle(pod)

    now = stored(admin, pod)
    assert outcome is not None and outcome.action == "leave", outcome
    assert (gates(now), required_terms(now)) == ([], [])


def test_the_command_the_pod_runs_decides_not_the_image_entrypoint(
    registered: object, admin: client.ApiClient, registry: Registry, toolbox: str, tmp_path: Path
) -> None:
    ns, secrets = enforced(admin, registry)
    app = {"name": "app", "image": toolbox, "command": ["/usr/bin/tool"], "args": ["--serve"]}
    pod = create_pod(admin, ns, imagePullSecrets=secrets, containers=[app])

    outcome = placer(admin, registry, tmp_path).handle(pod)

    now = stored(admin, pod)
    assert outcome is not None and outcome.action == "place", outcome
    assert required_terms(now) == AMD64_ONLY
    [(_, reason, note)] = events(admin, now)
    assert reason == "Placed"
    assert note.startswith("placed on amd64 only: arm64: container 'app'")
    assert "/usr/bin/tool: " in note and "/usr/bin/server" not in note


def test_the_first_word_of_an_sh_c_script_decides(
    registered: object, admin: client.ApiClient, registry: Registry, toolbox: str, tmp_path: Path
) -> None:
    ns, secrets = enforced(admin, registry)
    script = "exec tool --serve --port 8080"
    pod = create_pod(admin, ns, imagePullSecrets=secrets, containers=[
        {"name": "app", "image": toolbox, "command": ["sh", "-c", script]}])  # fmt: skip

    outcome = placer(admin, registry, tmp_path).handle(pod)

    assert outcome is not None and outcome.action == "place", outcome
    assert required_terms(stored(admin, pod)) == AMD64_ONLY
    assert "arm64: container 'app' " in outcome.message and "/usr/bin/tool: " in outcome.message


def test_a_wrong_arch_helper_the_pod_never_starts_is_named_but_does_not_restrict(
    registered: object, admin: client.ApiClient, registry: Registry, toolbox: str, tmp_path: Path
) -> None:
    ns, secrets = enforced(admin, registry)
    pod = create_pod(admin, ns, imagePullSecrets=secrets, containers=[
        {"name": "app", "image": toolbox}])  # fmt: skip

    outcome = placer(admin, registry, tmp_path).handle(pod)

    now = stored(admin, pod)
    assert outcome is not None and outcome.action == "leave", outcome
    assert (gates(now), required_terms(now)) == ([], [])
    [(kind, reason, note)] = events(admin, now)
    assert (kind, reason) == ("Normal", "PlacementUnchanged")
    assert note.startswith("runs on every node architecture; not deciding: arm64: container 'app'")
    assert "/usr/bin/tool: " in note


def test_with_strict_every_binary_decides(
    registered: object, admin: client.ApiClient, registry: Registry, toolbox: str, tmp_path: Path
) -> None:
    ns, secrets = enforced(admin, registry)
    pod = create_pod(admin, ns, imagePullSecrets=secrets, containers=[
        {"name": "app", "image": toolbox}])  # fmt: skip

    outcome = placer(admin, registry, tmp_path, strict=True).handle(pod)

    assert outcome is not None and outcome.action == "place", outcome
    assert required_terms(stored(admin, pod)) == AMD64_ONLY


def test_the_service_accounts_pull_secret_is_used(
    registered: object, admin: client.ApiClient, registry: Registry, toolbox: str, tmp_path: Path
) -> None:
    ns = namespace(admin, "enforce")
    secret = pull_secret(admin, ns, registry)
    client.CoreV1Api(admin).create_namespaced_service_account(
        ns, {"metadata": {"name": "puller"}, "imagePullSecrets": [{"name": secret}]}
    )
    pod = create_pod(admin, ns, serviceAccountName="puller", containers=[
        {"name": "app", "image": toolbox, "command": ["/usr/bin/tool"]}])  # fmt: skip

    outcome = placer(admin, registry, tmp_path).handle(pod)

    assert outcome is not None and outcome.action == "place", outcome


@pytest.mark.parametrize("secret", [None, "wrong password"])
def test_a_pod_without_valid_pull_credentials_is_ungated_unchanged(
    registered: object,
    admin: client.ApiClient,
    registry: Registry,
    toolbox: str,
    tmp_path: Path,
    secret: str | None,
) -> None:
    ns = namespace(admin, "enforce")
    spec: dict[str, Any] = {"containers": [{"name": "app", "image": toolbox}]}
    if secret is not None:
        spec["imagePullSecrets"] = [{"name": pull_secret(admin, ns, registry, password=secret)}]
    pod = create_pod(admin, ns, **spec)
    made = placer(admin, registry, tmp_path)

    outcome = made.handle(pod)

    now = stored(admin, pod)
    assert outcome is not None and outcome.action == "fail-open", outcome
    assert (gates(now), required_terms(now)) == ([], [])
    [(kind, reason, note)] = events(admin, now)
    assert (kind, reason) == ("Warning", "PlacementSkipped")
    assert note.startswith("placed without a verdict: ") and registry.host in note
    assert "\n" not in note


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
