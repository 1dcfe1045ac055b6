"""Observed failures cannot cross tenants, against the real API server and registry.

A tenant's sighting (what the handler saw fail in its pod) decides for the pods of its own
namespace and owner. For anyone else it counts only when the controller's scan of the
image's own file at that path fails on that platform too: a file the tenant wrote into
`/tmp`, mounted, or replaced at run time is not the image's. Sightings expire a fixed time
after they were written, however often they are read."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from kubernetes import client

from execwatch.placement.observed import Feedback
from execwatch.placement.verdicts import Sighting, VerdictStore, VerdictWriter, now_rfc3339
from tests.placement.cluster import create_pod, rest_for
from tests.placement.observedpods import record_of, running_pod
from tests.placement.test_controller import events, required_terms, stored
from tests.placement.test_scanned import (
    AMD64_ONLY,
    FirstPod,
    enforced,
    first_pod,
    placer,
    reads,
    toolbox,
    writer,
)
from tests.placement.test_verdicts import crd, store
from tests.support.registry.registry_server import Registry
from tests.support.wait import wait_until

__all__ = ["crd", "store", "toolbox", "writer"]


def tenant_ran(admin: client.ApiClient, first: FirstPod, image: str) -> dict[str, Any]:
    """A pod of a ReplicaSet of the first pod's namespace that ran the image's digest."""
    image_id = f"{image.rsplit(':', 1)[0]}@{first.verdict.digest}"
    return running_pod(admin, first.ns, image_id, name="ran")


def feed(admin: client.ApiClient, ran: dict[str, Any], *failures: tuple[str, str]) -> None:
    """What the handler counts for `ran`: each (node architecture, path) failing."""
    feedback = Feedback(rest_for(admin))
    feedback.start()
    for arch, path in failures:
        feedback.offer(record_of(ran, node_arch=arch, path=path))
    wait_until(feedback.idle)
    feedback.stop()


def pod_in(
    admin: client.ApiClient, registry: Registry, image: str, ns: str | None = None, **meta: Any
) -> dict[str, Any]:
    """A pod of `image` that starts what the image starts, in `ns` (a new enforce namespace
    when None) with a pull secret."""
    if ns is None:
        ns, secrets = enforced(admin, registry)
    else:
        secrets = [{"name": "pull"}]
    app = {"name": "app", "image": image}
    return create_pod(admin, ns, metadata={"name": "p", **meta}, imagePullSecrets=secrets,
                      containers=[app])  # fmt: skip


def test_an_arm64_file_a_tenant_wrote_into_tmp_never_holds_another_namespaces_pods(
    registered: object,
    admin: client.ApiClient,
    registry: Registry,
    pushed: dict[str, str],
    store: VerdictStore,
    writer: VerdictWriter,
    tmp_path: Path,
) -> None:
    image = pushed["hello"]  # honest: runs on amd64 and arm64
    a = first_pod(admin, registry, image, writer, tmp_path)
    ran = tenant_ran(admin, a, image)
    feed(admin, ran, ("amd64", "/tmp/evil"), ("arm64", "/tmp/evil"))

    victim = pod_in(admin, registry, image)
    outcome = placer(admin, registry, tmp_path, writer=writer).handle(victim)

    assert outcome is not None and outcome.action == "leave", outcome
    assert "/tmp/evil" not in outcome.message
    assert [(k, r) for k, r, _ in events(admin, stored(admin, victim))] == [
        ("Normal", "PlacementUnchanged")
    ]
    # The same namespace, another workload: not the tenant's word about it either.
    other = pod_in(admin, registry, image, a.ns, name="other")
    outcome = placer(admin, registry, tmp_path, writer=writer).handle(other)
    assert outcome is not None and outcome.action == "leave", outcome
    # The tenant's own workload: held by what it saw fail, with its own words.
    own = pod_in(admin, registry, image, a.ns, name="own",
                 ownerReferences=ran["metadata"]["ownerReferences"])  # fmt: skip
    outcome = placer(admin, registry, tmp_path, writer=writer).handle(own)
    assert outcome is not None and outcome.action == "nowhere", outcome
    assert "observed failing in this workload: ForeignArchitecture: /tmp/evil" in outcome.message


def test_a_failure_of_the_images_own_file_counts_for_every_namespace_once_confirmed(
    registered: object,
    admin: client.ApiClient,
    registry: Registry,
    toolbox: str,
    store: VerdictStore,
    writer: VerdictWriter,
    tmp_path: Path,
) -> None:
    """toolbox's /usr/bin/tool is x86-64 in its arm64 image too; /usr/bin/server runs on
    both. A tenant that saw both fail (the server replaced at run time) convinces the
    controller of the first only: its scan of the image's own tool fails on arm64."""
    a = first_pod(admin, registry, toolbox, writer, tmp_path)
    assert a.outcome is not None and a.outcome.action == "leave"  # the tool is not started
    ran = tenant_ran(admin, a, toolbox)
    feed(admin, ran, ("arm64", "/usr/bin/tool"), ("amd64", "/usr/bin/server"))

    victim = pod_in(admin, registry, toolbox)
    outcome = placer(admin, registry, tmp_path, writer=writer).handle(victim)

    assert outcome is not None and outcome.action == "place", outcome
    assert required_terms(stored(admin, victim)) == AMD64_ONLY
    assert "the image's own /usr/bin/tool fails there: /usr/bin/tool" in outcome.message
    assert "ForeignArchitecture" not in outcome.message, "the scan's words, not the tenant's"
    assert reads(writer, "observed") == 1


def test_a_sighting_expires_its_ttl_after_it_was_written_however_often_it_is_read(
    registered: object,
    admin: client.ApiClient,
    registry: Registry,
    pushed: dict[str, str],
    store: VerdictStore,
    writer: VerdictWriter,
    tmp_path: Path,
) -> None:
    ttl = 10.0
    image = pushed["hello"]
    a = first_pod(admin, registry, image, writer, tmp_path)
    written = time.time()
    owner = "ReplicaSet/app-1"
    seen = Sighting("linux/arm64", a.ns, owner, "/opt/tool", now_rfc3339(lambda: written), "x", 1)
    store.record(a.verdict.digest, image, [], [seen])
    refs = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "app-1",
             "uid": "0b5e7d4c-0000-4000-8000-000000000001", "controller": True}]  # fmt: skip

    actions = []
    for i in range(2):  # read and decided, again, within the ttl
        pod = pod_in(admin, registry, image, a.ns, name=f"own-{i}", ownerReferences=refs)
        outcome = placer(admin, registry, tmp_path, writer=writer, observed_for=ttl).handle(pod)
        assert outcome is not None and time.time() - written < ttl - 1, "a slow test machine"
        actions.append(outcome.action)
    wait_until(writer.lane.idle)
    time.sleep(max(0.0, written + ttl - time.time()))
    late = pod_in(admin, registry, image, a.ns, name="late", ownerReferences=refs)
    outcome = placer(admin, registry, tmp_path, writer=writer, observed_for=ttl).handle(late)

    assert actions == ["place"] * 2
    assert outcome is not None and outcome.action == "leave", outcome
    got = store.get(a.verdict.digest)
    assert got is not None and got.observed == (seen,), "no read renewed it"
