"""The agent under its own seccomp profile on the real node (agent.seccomp.type=Localhost):
`helm upgrade` rolls it, the init container puts the profile in the kubelet's seccomp
directory before the agent's container is created, the agent still catches and diagnoses a
real exec format error, and a syscall outside the profile fails with EPERM in the agent's
container, where the runtime's default profile let the same call through. Then the same as
non-root (agent.runAsNonRoot=true): uid 65532, its capabilities from the image's file
capabilities, the same profile.

Runs after the story (file order) and before test_uninstall, which upgrades and uninstalls
this release as these tests leave it: non-root, under the profile."""

from __future__ import annotations

import os
import time

from kubernetes import client
from kubernetes.stream import stream

from tests.deploy.test_seccomp import PROFILE
from tests.node.test_install import caps, container_pid, proc_status
from tests.node.test_story import agent_counter, exec_format_events, side_pod
from tests.support.deploy.chart import CHART, find, pod_spec, render
from tests.support.kubenode.helm_install import (
    NAMESPACE,
    RELEASE,
    Release,
    agent_pod,
    run_helm,
    wait_quota_counted,
    wait_workloads_ready,
)
from tests.support.kubenode.kubelet_node import Node, pod_ready, wait_for
from tests.support.kubenode.node_images import SIDE_FOREIGN
from tests.support.kubenode.story_workloads import ensure_namespace

NS = "confined"
NON_ROOT = 65532
# symlink(2) is in containerd's default profile and not in the agent's (nothing the agent
# does makes a link): what the call answers tells which profile is in force.
PROBE = """
import errno, os
try:
    os.symlink("target", "/tmp/seccomp-probe")
except OSError as exc:
    print(errno.errorcode[exc.errno])
else:
    print("allowed")
"""


def run_in_agent(node: Node, pod: client.V1Pod, *command: str) -> str:
    """What `kubectl exec` of `command` in the agent's container prints (API server,
    kubelet, containerd, runc exec: the container's own seccomp filter applies)."""
    core = client.CoreV1Api(node.client())
    out: str = stream(
        core.connect_get_namespaced_pod_exec,
        pod.metadata.name,
        NAMESPACE,
        container="agent",
        command=list(command),
        stderr=True,
        stdin=False,
        stdout=True,
        tty=False,
        _request_timeout=60,
    )
    return out.strip()


def localhost_agent(node: Node, uid: int = 0) -> client.V1Pod | None:
    """The agent pod, Ready, under the Localhost profile and running as `uid`."""
    pods = node.core().list_namespaced_pod(
        NAMESPACE, label_selector="app.kubernetes.io/component=agent"
    )
    for pod in pods.items:
        ctx = pod.spec.containers[0].security_context
        profile = ctx.seccomp_profile
        if (
            profile is not None
            and profile.type == "Localhost"
            and ctx.run_as_user == uid
            and pod.metadata.deletion_timestamp is None
            and pod_ready(pod)
        ):
            return pod
    return None


def upgrade(node: Node, uid: int, *sets: str) -> tuple[client.V1Pod, float]:
    """helm upgrade --reuse-values with `sets`; the new agent pod and the seconds to Ready."""
    t0 = time.monotonic()
    argv = ["upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE, "--reuse-values"]
    for s in sets:
        argv += ["--set", s]
    run_helm(node, *argv)
    pod = wait_for("the new agent Ready", lambda: localhost_agent(node, uid), 180)
    wait_workloads_ready(node)
    return pod, time.monotonic() - t0


def catches_and_diagnoses(node: Node, pod: client.V1Pod, name: str) -> None:
    """A side process in a new pod fails to exec an arm64 binary: the agent `pod` reports
    it (the handler's Event) and diagnoses it in a worker process under the same profile."""
    wait_quota_counted(node)  # until then every record is refused (test_story)
    before = agent_counter(node, "execwatch_events_total", reason="ForeignArchitecture")
    ensure_namespace(node, NS)
    node.core().create_namespaced_pod(NS, side_pod(name, NS))
    (event,) = wait_for(
        f"execwatch's Event for {name}", lambda: exec_format_events(node, NS, name), 60
    )
    assert f"could not exec {SIDE_FOREIGN} (ENOEXEC): a arm64 binary" in event.message
    wait_for(
        "a ForeignArchitecture diagnosis by the confined agent",
        lambda: (
            agent_counter(node, "execwatch_events_total", reason="ForeignArchitecture") > before
        ),
        30,
    )
    now = agent_pod(node)
    assert now.metadata.uid == pod.metadata.uid
    assert now.status.container_statuses[0].restart_count == 0


def test_under_the_runtimes_default_profile_the_probe_call_is_allowed(
    node: Node, release: Release
) -> None:
    assert run_in_agent(node, agent_pod(node), "python3", "-c", PROBE) == "allowed"


def test_the_agent_under_its_own_profile_catches_and_diagnoses_an_exec_format_error(
    node: Node, release: Release
) -> None:
    seccomp_dir = node.kubelet_root / "seccomp"
    pod, rolled = upgrade(
        node, 0, "agent.seccomp.type=Localhost", f"agent.seccomp.kubeletSeccompDir={seccomp_dir}"
    )
    assert (seccomp_dir / "execwatch-agent.json").read_bytes() == PROFILE.read_bytes()
    (init,) = pod.status.init_container_statuses
    assert init.state.terminated.exit_code == 0
    status = proc_status(container_pid(pod, "agent"))
    assert status["Seccomp"] == "2" and status["Seccomp_filters"] == "1"
    catches_and_diagnoses(node, pod, "reporter")
    print(f"agent rolled to its Localhost profile in {rolled:.1f}s")


def test_a_syscall_outside_the_profile_fails_with_eperm_in_the_agents_container(
    node: Node, release: Release
) -> None:
    pod = localhost_agent(node)
    assert pod is not None, "the previous test rolls the agent to its Localhost profile"
    assert run_in_agent(node, pod, "python3", "-c", PROBE) == "EPERM"
    # The same interpreter, in the same container, runs otherwise.
    assert run_in_agent(node, pod, "python3", "-c", "print(sum(range(4)))") == "6"


def test_as_non_root_under_the_same_profile_the_agent_still_diagnoses(
    node: Node, release: Release
) -> None:
    """docs/privileges.md: a non-root agent's spool directory must be its own."""
    spool = node.workdir / "spool-65532"
    spool.mkdir()
    os.chown(spool, NON_ROOT, NON_ROOT)
    pod, rolled = upgrade(node, NON_ROOT, "agent.runAsNonRoot=true", f"agent.spoolHostPath={spool}")
    chart = pod_spec(find(render(*release.values, "agent.runAsNonRoot=true"), "DaemonSet"))
    added = set(chart["containers"][0]["securityContext"]["capabilities"]["add"])
    pid = container_pid(pod, "agent")
    # Ready comes before the probe loads: the agent raises its permitted file capabilities
    # to effective then (probe/caps.py).

    def raised() -> dict[str, str] | None:
        status = proc_status(pid)
        return status if caps(status["CapEff"]) else None

    status = wait_for("the agent's effective capabilities", raised, 60)
    assert status["Uid"].split() == [str(NON_ROOT)] * 4
    assert caps(status["CapEff"]) == added  # raised from the interpreter's file capabilities
    assert status["NoNewPrivs"] == "0"  # allowPrivilegeEscalation: file capabilities count
    assert status["Seccomp"] == "2" and status["Seccomp_filters"] == "1"
    assert run_in_agent(node, pod, "python3", "-c", PROBE) == "EPERM"
    catches_and_diagnoses(node, pod, "reporter-nonroot")
    assert [p.name for p in spool.glob("spool-*.db")], "the agent's spool is in its directory"
    print(f"agent rolled to non-root in {rolled:.1f}s")
