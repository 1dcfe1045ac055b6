"""helm upgrade rolls the agent; helm uninstall leaves no BPF program or map behind, no record
waiting for a label patch, no pod gated by placement (test_story_placement turned it on), and
keeps the CRD as documented; the node leaves nothing behind.

Runs last (file order): it ends the release and then the node itself."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from pathlib import Path

from kubernetes import client

from tests.node.placement import GATE, WebhookRoute, gated, take_placement_lease
from tests.node.test_install import container_pid
from tests.support.deploy.chart import CHART
from tests.support.kubenode.helm_install import (
    NAMESPACE,
    RELEASE,
    Release,
    agent_pod,
    run_helm,
    wait_workloads_ready,
)
from tests.support.kubenode.kubelet_node import Node, pod_ready, wait_for
from tests.support.kubenode.node_images import WEB_V1
from tests.support.kubenode.story_workloads import container, ensure_namespace

CRD = "execfailures.execwatch.io"
GATED_NS = "gated"


def bpf_objects(kind: str) -> list[dict[str, object]]:
    """`bpftool KIND show --json`: every program or map in the kernel, with holder pids."""
    out = subprocess.run(
        ["bpftool", kind, "show", "--json"], capture_output=True, text=True, check=True, timeout=30
    )
    objs: list[dict[str, object]] = json.loads(out.stdout)
    return objs


def held_by(kind: str, pid: int) -> set[int]:
    """Ids of the BPF programs or maps the process holds, from its fds' fdinfo
    (`prog_id:` / `map_id:`); this bpftool cannot name holder pids."""
    ids = set()
    for info in Path(f"/proc/{pid}/fdinfo").iterdir():
        with contextlib.suppress(OSError):
            for line in info.read_text().splitlines():
                key, _, value = line.partition(":")
                if key == f"{kind}_id":
                    ids.add(int(value))
    return ids


def records(node: Node) -> list[dict[str, object]]:
    items: list[dict[str, object]] = client.CustomObjectsApi(
        node.client()
    ).list_namespaced_custom_object("execwatch.io", "v1alpha1", NAMESPACE, "execfailures")["items"]
    return items


def test_upgrade_to_a_changed_value_rolls_the_agent(node: Node, release: Release) -> None:
    before = agent_pod(node)
    apps = client.AppsV1Api(node.client())
    strategy = apps.read_namespaced_daemon_set("execwatch-agent", NAMESPACE).spec.update_strategy
    blind, last_ready, t0 = 0.0, time.monotonic(), time.monotonic()
    run_helm(
        node, "upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE,
        "--reuse-values", "--set", "agent.logLevel=debug",
    )  # fmt: skip
    core = node.core()

    def rolled() -> bool:
        nonlocal blind, last_ready
        agents = core.list_namespaced_pod(
            NAMESPACE, label_selector="app.kubernetes.io/component=agent"
        )
        now = time.monotonic()
        if any(pod_ready(p) for p in agents.items):
            last_ready = now
        else:
            blind = max(blind, now - last_ready)
        return any(
            p.metadata.uid != before.metadata.uid
            and pod_ready(p)
            and "--log-level=debug" in p.spec.containers[0].args
            for p in agents.items
        )

    wait_for("the agent rolled to the new value", rolled, 180, every=0.2)
    wait_for(
        "the old agent gone",
        lambda: all(
            p.metadata.uid != before.metadata.uid
            for p in core.list_namespaced_pod(
                NAMESPACE, label_selector="app.kubernetes.io/component=agent"
            ).items
        ),
        60,
    )
    wait_workloads_ready(node)
    print(
        f"agent rollout {time.monotonic() - t0:.1f}s, no agent Ready for {blind:.1f}s "
        f"(updateStrategy {strategy.rolling_update})"
    )
    surge = strategy.rolling_update.max_surge
    if surge not in (None, 0, "0", "0%"):
        assert blind < 1.0, "with maxSurge the new agent is Ready before the old one stops"


def test_pods_stay_gated_while_no_placement_controller_leads(node: Node, release: Release) -> None:
    """With its Lease held by someone else, no replica places pods while every replica's
    webhook still gates them: what `helm uninstall` must not leave behind."""
    take_placement_lease(node)
    ensure_namespace(node, GATED_NS)
    core = node.core()
    core.patch_namespace(GATED_NS, {"metadata": {"labels": {"execwatch.io/placement": "enforce"}}})
    route = WebhookRoute()
    try:
        route.add(node)
        for name in ("held-a", "held-b"):
            core.create_namespaced_pod(
                GATED_NS,
                client.V1Pod(
                    metadata=client.V1ObjectMeta(name=name),
                    spec=client.V1PodSpec(containers=[container("web", WEB_V1)]),
                ),
            )
    finally:
        route.remove()
    time.sleep(10)  # a leader places a pod within a second or two
    pods = core.list_namespaced_pod(GATED_NS).items
    assert len(pods) == 2
    assert all(gated(p) and not p.spec.node_name for p in pods), [p.spec for p in pods]


def test_uninstall_leaves_no_bpf_no_records_and_keeps_the_crd(node: Node, release: Release) -> None:
    pod = agent_pod(node)
    pid = container_pid(pod, "agent")
    progs, maps = held_by("prog", pid), held_by("map", pid)
    assert progs, "the agent holds its BPF programs"
    assert maps
    # Nothing waits for the handler (a record is deleted only after its label patch).
    wait_for("no ExecFailure record left", lambda: not records(node), 60)

    run_helm(node, "uninstall", RELEASE, "--namespace", NAMESPACE, "--wait")
    core = node.core()
    wait_for(
        "execwatch pods gone",
        lambda: not core.list_namespaced_pod(NAMESPACE).items,
        120,
    )
    # Placement's pre-delete hook ungated what no controller would have placed.
    held = core.list_namespaced_pod(GATED_NS).items
    assert held and not [p.metadata.name for p in held if gated(p)], f"{GATE} left"
    for pod in held:
        skipped = core.list_namespaced_event(
            GATED_NS,
            field_selector=f"involvedObject.name={pod.metadata.name},reason=PlacementSkipped",
        ).items
        assert any("execwatch placement is being removed" in e.message for e in skipped), skipped
    live_progs = {int(str(p["id"])) for p in bpf_objects("prog")}
    live_maps = {int(str(m["id"])) for m in bpf_objects("map")}
    assert not progs & live_progs, "BPF programs still attached after uninstall"
    assert not maps & live_maps, "BPF maps still alive (pinned?) after uninstall"

    # The CRD stays (helm.sh/resource-policy: keep), the rest of the release goes.
    ext = client.ApiextensionsV1Api(node.client())
    assert ext.read_custom_resource_definition(CRD).metadata.name == CRD
    rbac = client.RbacAuthorizationV1Api(node.client())
    assert not [
        r for r in rbac.list_cluster_role().items if r.metadata.name.startswith("execwatch")
    ]


def test_the_node_leaves_nothing_behind(node: Node) -> None:
    node.stop()
    assert node.leftovers() == []
