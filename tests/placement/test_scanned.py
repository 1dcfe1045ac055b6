"""Placement decided by the scan engine, against the real registry and API server.

The registry requires credentials; the controller pulls only with the pod's own
imagePullSecrets and its ServiceAccount's. What decides is what the pod starts: its
`command`/`args`, else the image's entrypoint, and the first word of an `sh -c`."""

from __future__ import annotations

import base64
import ipaddress
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from execwatch.placement.affinity import ARCH_LABEL
from execwatch.placement.controller import Handled as Placed
from execwatch.placement.controller import Placer
from execwatch.placement.observed import Feedback
from execwatch.placement.pullsecrets import PullSecrets
from execwatch.placement.scanned import ScannedVerdicts
from execwatch.placement.verdicts import (
    GROUP,
    PLURAL,
    VERSION,
    ImageVerdict,
    PlatformVerdict,
    VerdictMetrics,
    VerdictStore,
    VerdictWriter,
)
from execwatch.runnable.limits import Limits
from execwatch.runnable.verdict import Outcome
from execwatch.scan.egress import Egress
from execwatch.scan.registry import RegistryOptions
from tests.placement.cluster import create_pod, gates, namespace, rest_for
from tests.placement.observedpods import record_of, running_pod
from tests.placement.test_controller import Seen, events, required_terms, stored
from tests.placement.test_verdicts import crd, store
from tests.support.images.base_images import glibc_base
from tests.support.images.imagebuild import Image, file, oci_layout, symlink
from tests.support.registry.counting_proxy import CountingProxy
from tests.support.registry.registry_fixtures import arm64_root
from tests.support.registry.registry_server import PASSWORD, USER, Registry
from tests.support.wait import wait_until

__all__ = ["crd", "store"]

ARCHES = ("amd64", "arm64")
AMD64_ONLY = [{"matchExpressions": [{"key": ARCH_LABEL, "operator": "In", "values": ["amd64"]}]}]


def placer(
    admin: client.ApiClient,
    registry: Registry,
    tmp: Path,
    strict: bool = False,
    writer: VerdictWriter | None = None,
    fresh_for: float = 86400.0,
    observed_for: float = 86400.0,
) -> Placer:
    options = RegistryOptions(
        ca_file=str(registry.ca),
        cache_dir=str(tmp / "cache"),
        egress=Egress((ipaddress.ip_network("127.0.0.0/8"),)),  # the registry is on loopback
    )
    rest = rest_for(admin)
    source = ScannedVerdicts(
        PullSecrets(rest), options, Limits(), lambda: ARCHES, strict, writer, fresh_for,
        observed_for,
    )  # fmt: skip
    return Placer(rest, source, lambda: ARCHES, Seen())


def pull_secret(
    admin: client.ApiClient, ns: str, registry: Registry, password: str = PASSWORD, host: str = ""
) -> str:
    auth = base64.b64encode(f"{USER}:{password}".encode()).decode()
    config = json.dumps({"auths": {host or registry.host: {"auth": auth}}}).encode()
    client.CoreV1Api(admin).create_namespaced_secret(ns, {
        "metadata": {"name": "pull"},
        "type": "kubernetes.io/dockerconfigjson",
        "data": {".dockerconfigjson": base64.b64encode(config).decode()},
    })  # fmt: skip
    return "pull"


def left_as_is(
    admin: client.ApiClient, pod: dict[str, Any], outcome: Placed | None
) -> tuple[str, str, str]:
    """The pod ungated unchanged, neither narrowed nor held: its one Event (type, reason,
    note)."""
    now = stored(admin, pod)
    assert outcome is not None and outcome.action == "leave", outcome
    assert (gates(now), required_terms(now)) == ([], [])
    [event] = events(admin, now)
    return event


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

    kind, reason, note = left_as_is(admin, pod, outcome)
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


def test_a_second_pod_of_a_digest_costs_one_head_of_its_tag(
    registered: object,
    admin: client.ApiClient,
    registry: Registry,
    built: dict[str, Path],
    host_glibc: dict[str, bytes],
    tmp_path: Path,
) -> None:
    proxy = CountingProxy(registry)
    image = liar(registry, built, host_glibc, tmp_path / "liar").replace(registry.host, proxy.host)
    ns = namespace(admin, "enforce")
    secrets = [{"name": pull_secret(admin, ns, registry, host=proxy.host)}]
    spec = {"imagePullSecrets": secrets, "containers": [{"name": "app", "image": image}]}
    made = placer(admin, registry, tmp_path)
    try:
        first = made.handle(create_pod(admin, ns, metadata={"name": "first"}, **spec))
        platforms = [p for m, p in proxy.asked("manifests") if m == "GET" and "sha256:" in p]
        proxy.reset()
        second = made.handle(create_pod(admin, ns, metadata={"name": "second"}, **spec))
    finally:
        proxy.close()

    assert first is not None and second is not None
    assert first.action == second.action == "place" and first.message == second.message
    assert len(platforms) == 3  # the index and both platforms' manifests, by digest
    assert proxy.asked() == [("HEAD", "/v2/team/liar/manifests/1")]  # with the pod's secret
    assert proxy.connections == 0


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


@pytest.mark.parametrize("where", ["NETRC", ".netrc", ".docker/config.json"])
def test_credentials_of_the_controllers_own_stop_it_from_judging(
    registered: object,
    admin: client.ApiClient,
    registry: Registry,
    toolbox: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    where: str,
) -> None:
    """A pod must pull with its own secrets only: a file the registry client would read
    for credentials of its own (requests reads netrc for a request without any) means the
    pod is placed unchanged, never judged with the controller's access."""
    home = tmp_path / "home"
    own = tmp_path / "netrc" if where == "NETRC" else home / where
    own.parent.mkdir(parents=True, exist_ok=True)
    own.write_text(f"machine {registry.host.split(':')[0]} login {USER} password {PASSWORD}\n")
    monkeypatch.setenv("HOME", str(home))
    if where == "NETRC":
        monkeypatch.setenv("NETRC", str(own))
    ns = namespace(admin, "enforce")
    pod = create_pod(admin, ns, containers=[{"name": "app", "image": toolbox}])

    outcome = placer(admin, registry, tmp_path).handle(pod)

    now = stored(admin, pod)
    assert outcome is not None and outcome.action == "fail-open", outcome
    assert (gates(now), required_terms(now)) == ([], [])
    [(_, reason, note)] = events(admin, now)
    assert reason == "PlacementSkipped" and "credentials of its own" in note, note


@pytest.mark.parametrize(
    ("image", "cause"),
    [
        ("127.0.0.1:1/team/app:1", "connection refused by the registry"),
        ("10.255.255.1:5000/team/app:1", "registry destination refused: private address"),
    ],
)
def test_an_unreachable_registry_ungates_the_pod_unchanged(
    registered: object,
    admin: client.ApiClient,
    registry: Registry,
    tmp_path: Path,
    image: str,
    cause: str,
) -> None:
    """The Event names the failure's class, never the socket's words (issue 34: they
    made Events a port scanner); a private address no allowed network holds is refused
    before any connection."""
    pod = create_pod(admin, namespace(admin, "enforce"), containers=[
        {"name": "app", "image": image}])  # fmt: skip

    outcome = placer(admin, registry, tmp_path).handle(pod)

    now = stored(admin, pod)
    assert outcome is not None and outcome.action == "fail-open", outcome
    assert (gates(now), required_terms(now)) == ([], [])
    [(kind, reason, note)] = events(admin, now)
    assert (kind, reason) == ("Warning", "PlacementSkipped")
    assert note.startswith("placed without a verdict: ") and image.split("/")[0] in note
    assert cause in note and "Errno" not in note and "Connection refused" not in note


# -- the ImageVerdict store: scans written, read first, observed failures deciding ------


@pytest.fixture
def writer(store: VerdictStore) -> Iterator[VerdictWriter]:
    w = VerdictWriter(store, VerdictMetrics())
    w.start()
    yield w
    w.stop()


def the_verdict(store: VerdictStore, writer: VerdictWriter, image: str) -> ImageVerdict:
    """The one ImageVerdict written for `image`, once the writer is done."""
    wait_until(writer.lane.idle)
    items = store.rest.call("GET", f"/apis/{GROUP}/{VERSION}/{PLURAL}")["items"]
    [digest] = [i["spec"]["digest"] for i in items if i["spec"]["image"] == image]
    got = store.get(digest)
    assert got is not None
    return got


def reads(writer: VerdictWriter, result: str) -> float:
    value = writer.metrics.registry.get_sample_value(
        "execwatch_verdict_reads_total", {"result": result}
    )
    return value or 0.0


@dataclass(frozen=True)
class FirstPod:
    """The first pod of an image in a new enforce namespace, placed, and its verdict."""

    ns: str
    spec: dict[str, Any]  # the pod's spec: its pull secret, one container "app"
    outcome: Placed | None
    verdict: ImageVerdict


def first_pod(
    admin: client.ApiClient, registry: Registry, image: str, writer: VerdictWriter, tmp: Path
) -> FirstPod:
    ns, secrets = enforced(admin, registry)
    spec = {"imagePullSecrets": secrets, "containers": [{"name": "app", "image": image}]}
    outcome = placer(admin, registry, tmp, writer=writer).handle(create_pod(admin, ns, **spec))
    return FirstPod(ns, spec, outcome, the_verdict(writer.store, writer, image))


def test_a_scan_of_what_the_image_starts_is_written_to_its_verdict(
    registered: object,
    admin: client.ApiClient,
    registry: Registry,
    pushed: dict[str, str],
    store: VerdictStore,
    writer: VerdictWriter,
    tmp_path: Path,
) -> None:
    got = first_pod(admin, registry, pushed["hello"], writer, tmp_path).verdict

    assert {p: (v.outcome, v.source) for p, v in got.platforms.items()} == {
        "linux/amd64": (Outcome.RUNS, "scan"), "linux/arm64": (Outcome.RUNS, "scan"),
    }  # fmt: skip
    assert got.last_used is not None and abs(got.last_used - time.time()) < 60


def test_a_pod_that_starts_something_else_writes_no_verdict(
    registered: object,
    admin: client.ApiClient,
    registry: Registry,
    toolbox: str,
    store: VerdictStore,
    writer: VerdictWriter,
    tmp_path: Path,
) -> None:
    ns, secrets = enforced(admin, registry)
    app = {"name": "app", "image": toolbox, "command": ["/usr/bin/tool"]}
    pod = create_pod(admin, ns, imagePullSecrets=secrets, containers=[app])

    outcome = placer(admin, registry, tmp_path, writer=writer).handle(pod)

    assert outcome is not None and outcome.action == "place"
    wait_until(writer.lane.idle)
    assert store.rest.call("GET", f"/apis/{GROUP}/{VERSION}/{PLURAL}")["items"] == []


@pytest.mark.parametrize("age", [0.0, 2 * 86400.0])
def test_a_fresh_stored_verdict_decides_without_a_scan_a_stale_one_does_not(
    registered: object,
    admin: client.ApiClient,
    registry: Registry,
    pushed: dict[str, str],
    store: VerdictStore,
    writer: VerdictWriter,
    tmp_path: Path,
    age: float,
) -> None:
    first = first_pod(admin, registry, pushed["hello"], writer, tmp_path)
    digest = first.verdict.digest
    # A scan verdict that says arm64 fails, `age` seconds old: a scan would say it runs.
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - age))
    says = PlatformVerdict("linux/arm64", Outcome.FAILS, "scan", stamp, ("/usr/bin/hello: x",), 1)
    store.record(digest, pushed["hello"], [says])

    again = create_pod(admin, first.ns, metadata={"name": "q"}, **first.spec)
    outcome = placer(admin, registry, tmp_path, writer=writer).handle(again)  # an empty memo

    assert outcome is not None
    if age == 0.0:  # both platforms from the store: no scan at all
        assert outcome.action == "place" and required_terms(stored(admin, again)) == AMD64_ONLY
        assert "/usr/bin/hello: x" in outcome.message and reads(writer, "fresh") == 2
    else:  # amd64 from the store (written by the first pod), arm64 scanned again
        assert outcome.action == "leave" and reads(writer, "fresh") == 1


def test_an_observed_failure_sends_new_pods_of_its_workload_elsewhere(
    registered: object,
    admin: client.ApiClient,
    registry: Registry,
    pushed: dict[str, str],
    store: VerdictStore,
    writer: VerdictWriter,
    tmp_path: Path,
) -> None:
    first = first_pod(admin, registry, pushed["hello"], writer, tmp_path)
    assert first.outcome is not None and first.outcome.action == "leave"  # runs on both
    ns, digest = first.ns, first.verdict.digest
    # The pod ran on an arm64 node and its container failed there, a binary from a volume.
    ran = running_pod(admin, ns, f"{pushed['hello'].rsplit(':', 1)[0]}@{digest}", name="ran")
    feedback = Feedback(rest_for(admin))
    feedback.start()
    feedback.offer(record_of(ran, node_arch="arm64", path="/data/tool"))
    wait_until(feedback.idle)
    feedback.stop()

    command = {"name": "app", "image": pushed["hello"], "command": ["/usr/bin/hello"]}
    owned = {"name": "new", "ownerReferences": ran["metadata"]["ownerReferences"]}
    new = create_pod(admin, ns, metadata=owned, **{**first.spec, "containers": [command]})
    outcome = placer(admin, registry, tmp_path, writer=writer).handle(new)

    assert outcome is not None and outcome.action == "place", outcome
    assert required_terms(stored(admin, new)) == AMD64_ONLY
    assert "arm64: container 'app'" in outcome.message
    assert "observed failing in this workload: ForeignArchitecture: /data/tool" in outcome.message
    assert reads(writer, "observed") == 1
    got = store.get(digest)
    assert got is not None and [s.path for s in got.observed] == ["/data/tool"]
