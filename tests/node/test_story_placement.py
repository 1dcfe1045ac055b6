"""Placement by binary truth on the real node beside simulated nodes of both architectures
(docs/placement.md; issue 26 §4): the chart's placement turned on with helm, three kwok
nodes (two arm64, one amd64; tainted, so only pods that tolerate it go there), images in a
real registry.

- An image whose amd64 manifest carries arm64 binaries: in an `enforce` namespace its pod
  goes to an arm64 node; the same Deployment in a namespace without the label lands on the
  real amd64 node and crash-loops, and execwatch says why.
- Runtime feedback and mitigation: an image whose entrypoint runs an arm64 program from a
  ConfigMap, which no static verdict sees ("runs" everywhere). Its first pod keeps failing on
  the real node; the handler writes a sighting on amd64 for its namespace and ReplicaSet;
  in a `mitigate` namespace the pod is evicted and its replacement is placed on arm64.

Both Deployments prefer the real node (a preferred node affinity), so that without placement
the scheduler's choice among the four nodes is the real one.

Placement stays on for test_uninstall: `helm uninstall` runs its pre-delete hook."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client

from tests.node.placement import (
    ARCH_LABEL,
    KwokNodes,
    Published,
    aarch64_exit,
    placement_on,
    publish,
    root_dirs,
)
from tests.support.images.imagebuild import Image, file, symlink
from tests.support.kube.kwok import TOLERATION
from tests.support.kubenode.helm_install import Release
from tests.support.kubenode.kubelet_node import NODE_NAME, Node, wait_for
from tests.support.kubenode.story_workloads import restarts
from tests.support.runtime.runc import FOREIGN_BUSYBOX, HOST_BUSYBOX

MODE = "execwatch.io/placement"
ENFORCE, CONTROL, MITIGATE = "placed", "unplaced", "mitigated"
HANDLER = "execwatch.io/handler"
PLACER = "execwatch.io/placement"
TOOL = "/tools/run"  # the ConfigMap's arm64 program
LOOP = f"while true; do {TOOL}; sleep 2; done"
IV = ("execwatch.io", "v1alpha1", "imageverdicts")


@dataclass
class Story:
    node: Node
    kwok: KwokNodes
    liar: Published  # amd64 manifest, arm64 entrypoint; an honest arm64 manifest
    looper: Published  # honest on both; its entrypoint runs TOOL


def liar_images() -> list[Image]:
    layer = [*root_dirs(), file("bin/server", FOREIGN_BUSYBOX.read_bytes())]
    start = ["/bin/server", "sleep", "3600"]
    return [Image([layer], arch, entrypoint=start) for arch in ("amd64", "arm64")]


def looper_images() -> list[Image]:
    applets = [symlink(f"bin/{a}", "busybox") for a in ("sh", "sleep")]
    return [
        Image(
            [[*root_dirs(), file("bin/busybox", busybox.read_bytes()), *applets]],
            arch,
            entrypoint=["/bin/sh", "-c", LOOP],
        )
        for arch, busybox in (("amd64", HOST_BUSYBOX), ("arm64", FOREIGN_BUSYBOX))
    ]


@pytest.fixture(scope="module")
def story(node: Node, release: Release) -> Iterator[Story]:
    t0 = time.monotonic()
    with placement_on(node) as (kwok, registry, _route):
        liar = publish(node, registry, "team/liar", "1", liar_images())
        looper = publish(node, registry, "team/looper", "1", looper_images())
        print(f"placement on, kwok nodes Ready, images published in {time.monotonic() - t0:.1f}s")
        try:
            yield Story(node, kwok, liar, looper)
        finally:
            delete_workloads(node, (ENFORCE, CONTROL, MITIGATE))


def delete_workloads(node: Node, names: tuple[str, ...]) -> None:
    """The story's Deployments deleted and their pods gone. The namespaces stay, as
    test_story's do, with the Events test_uninstall may still look at."""
    apps, core = client.AppsV1Api(node.client()), node.core()
    for ns in names:
        for dep in apps.list_namespaced_deployment(ns).items:
            apps.delete_namespaced_deployment(
                dep.metadata.name, ns, propagation_policy="Foreground"
            )
    wait_for(
        "the story's pods gone",
        lambda: not [p for ns in names for p in core.list_namespaced_pod(ns).items],
        120,
        every=1.0,
    )


def namespace(node: Node, name: str, mode: str = "") -> None:
    labels = {MODE: mode} if mode else {}
    node.core().create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels=labels))
    )
    wait_for(
        f"ServiceAccount {name}/default",
        lambda: node.core().list_namespaced_service_account(name).items,
        60,
    )


def deployment(name: str, image: str, **spec: Any) -> dict[str, Any]:
    """One replica that tolerates the kwok nodes and prefers the real node."""
    labels = {"app": name}
    prefer = {"matchExpressions": [
        {"key": "kubernetes.io/hostname", "operator": "In", "values": [NODE_NAME]}
    ]}  # fmt: skip
    pod = {
        "containers": [{"name": name, "image": image, "imagePullPolicy": "IfNotPresent"}],
        "tolerations": [TOLERATION],
        "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 100, "preference": prefer}
        ]}},
        "terminationGracePeriodSeconds": 1,
        **spec,
    }  # fmt: skip
    return {
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    }


def live_pods(node: Node, ns: str, app: str) -> list[Any]:
    items = node.core().list_namespaced_pod(ns, label_selector=f"app={app}").items
    return [p for p in items if p.metadata.deletion_timestamp is None]


def scheduled(node: Node, ns: str, app: str, timeout: float = 120) -> Any:
    (pod,) = wait_for(
        f"the pod of {ns}/{app} scheduled",
        lambda: [p for p in live_pods(node, ns, app) if p.spec.node_name] or None,
        timeout,
        every=1.0,
    )
    return pod


def events(node: Node, ns: str, pod: str, component: str) -> list[Any]:
    listed = node.core().list_namespaced_event(
        ns, field_selector=f"involvedObject.name={pod},reportingComponent={component}"
    )
    return list(listed.items)


def event(node: Node, ns: str, pod: str, component: str, reason: str) -> Any:
    found = wait_for(
        f"{component}'s {reason} Event on {ns}/{pod}",
        lambda: [e for e in events(node, ns, pod, component) if e.reason == reason],
        90,
        every=1.0,
    )
    return found[0]


def arch_terms(pod: Any) -> list[list[str]]:
    """The `kubernetes.io/arch In` values of each required nodeSelectorTerm."""
    affinity = pod.spec.affinity.node_affinity if pod.spec.affinity else None
    required = affinity.required_during_scheduling_ignored_during_execution if affinity else None
    return [
        sorted(v for e in term.match_expressions or [] if e.key == ARCH_LABEL for v in e.values)
        for term in (required.node_selector_terms if required else [])
    ]


def verdict(node: Node, digest: str) -> dict[str, Any] | None:
    custom = client.CustomObjectsApi(node.client())
    try:
        got: dict[str, Any] = custom.get_cluster_custom_object(*IV, digest.replace(":", "-"))
    except client.ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return got


def platform(found: dict[str, Any] | None, name: str, kind: str = "platforms") -> dict[str, Any]:
    """The verdict's entry for platform `name` among its scans (`platforms`) or its
    sightings (`observed`)."""
    for entry in ((found or {}).get("status") or {}).get(kind) or []:
        if entry["platform"] == name:
            return dict(entry)
    return {}


def test_an_image_whose_amd64_manifest_holds_arm64_binaries_is_placed_on_arm64(
    story: Story,
) -> None:
    node = story.node
    namespace(node, ENFORCE, "enforce")
    apps = client.AppsV1Api(node.client())
    apps.create_namespaced_deployment(ENFORCE, deployment("app", story.liar.ref))
    pod = scheduled(node, ENFORCE, "app")
    assert pod.spec.node_name in story.kwok.of_arch("arm64"), pod.spec.node_name
    assert not pod.spec.scheduling_gates
    assert arch_terms(pod) == [["arm64"]]
    placed = event(node, ENFORCE, pod.metadata.name, PLACER, "Placed")
    assert placed.type == "Normal"
    assert placed.message.startswith("placed on arm64 only: amd64: container 'app'"), placed.message
    assert "/bin/server" in placed.message
    wait_for(
        "the placed pod Running (kwok)",
        lambda: (
            node.core().read_namespaced_pod(pod.metadata.name, ENFORCE).status.phase == "Running"
        ),
        60,
    )


def test_the_same_deployment_without_the_label_crash_loops_on_the_real_node(
    story: Story,
) -> None:
    node = story.node
    namespace(node, CONTROL)
    apps = client.AppsV1Api(node.client())
    apps.create_namespaced_deployment(CONTROL, deployment("app", story.liar.ref))
    pod = scheduled(node, CONTROL, "app")
    assert pod.spec.node_name == NODE_NAME
    assert arch_terms(pod) == []
    name = pod.metadata.name
    wait_for(
        "the control pod restarted",
        lambda: restarts(node.core().read_namespaced_pod(name, CONTROL)) >= 1,
        120,
        every=1.0,
    )
    failed = event(node, CONTROL, name, HANDLER, "ExecFormatError")
    assert failed.type == "Warning"
    assert 'container "app" could not exec /bin/server (ENOEXEC)' in failed.message
    assert "a arm64 binary on a amd64 node" in failed.message
    assert not events(node, CONTROL, name, PLACER)
    # The node's imageID is the registry's digest: what the handler's feedback reads.
    status = node.core().read_namespaced_pod(name, CONTROL).status.container_statuses[0]
    assert status.image_id.endswith("@" + story.liar.digest), status.image_id


def test_a_foreign_program_from_a_configmap_is_observed_and_mitigated_onto_arm64(
    story: Story,
) -> None:
    node = story.node
    namespace(node, MITIGATE, "mitigate")
    core = node.core()
    program = aarch64_exit()
    core.create_namespaced_config_map(
        MITIGATE,
        client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name="tools"),
            binary_data={"run": base64.b64encode(program).decode()},
        ),
    )
    volume = {"name": "tools", "configMap": {"name": "tools", "defaultMode": 0o755}}
    body = deployment("tool", story.looper.ref, volumes=[volume])
    body["spec"]["template"]["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "tools", "mountPath": "/tools", "readOnly": True}
    ]
    t0 = time.monotonic()
    client.AppsV1Api(node.client()).create_namespaced_deployment(MITIGATE, body)

    first = scheduled(node, MITIGATE, "tool")
    assert first.spec.node_name == NODE_NAME
    unchanged = event(node, MITIGATE, first.metadata.name, PLACER, "PlacementUnchanged")
    assert "runs on every node architecture" in unchanged.message  # the static verdict

    # The agent sees the exec fail, the handler posts it and writes the sighting.
    failed = event(node, MITIGATE, first.metadata.name, HANDLER, "ExecFormatError")
    assert f"could not exec {TOOL} (ENOEXEC)" in failed.message
    observed = wait_for(
        "a sighting on linux/amd64",
        lambda: platform(verdict(node, story.looper.digest), "linux/amd64", "observed") or None,
        120,
        every=1.0,
    )
    assert observed["namespace"] == MITIGATE and observed["owner"].startswith("ReplicaSet/")
    assert TOOL in observed["why"], observed

    # Mitigation: the pod is evicted, its ReplicaSet recreates it, placement sends it to arm64.
    mitigated = event(node, MITIGATE, first.metadata.name, PLACER, "PlacementMitigated")
    assert mitigated.type == "Warning"
    assert mitigated.message.startswith("evicted: "), mitigated.message
    replacement = wait_for(
        "the replacement placed",
        lambda: (
            [
                p
                for p in live_pods(node, MITIGATE, "tool")
                if p.metadata.uid != first.metadata.uid and p.spec.node_name
            ]
            or None
        ),
        120,
        every=1.0,
    )[0]
    assert replacement.spec.node_name in story.kwok.of_arch("arm64"), replacement.spec.node_name
    assert arch_terms(replacement) == [["arm64"]]
    placed = event(node, MITIGATE, replacement.metadata.name, PLACER, "Placed")
    assert "placed on arm64 only: amd64: container 'tool'" in placed.message
    assert "observed failing in this workload" in placed.message
    print(f"observed, evicted and placed on arm64 in {time.monotonic() - t0:.1f}s")
