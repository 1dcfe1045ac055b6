"""The first seed's "partial failures" on the real node: a node where a binfmt_misc emulator
for arm64 is registered, as a `qemu-user-static` package or a `tonistiigi/binfmt` DaemonSet
leaves it, runs a pod's arm64 binary slowly instead of failing it. The agent, in its
container, reads the node's table through the node's root (`agent.hostRoot`), and the pod
gets an `Emulated` Warning Event and label and the handler counts it; once the entry is
gone the same binary fails with an exec format error.

The entry goes into the node's own table (a container's execs use the initial user
namespace's, not a private one), named EMULATOR and removed, with the table's mount if
this test made it, before the test ends: later tests run arm64 binaries and expect
ENOEXEC."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

from kubernetes import client

from tests.node.test_story import agent_counter, exec_format_events, side_pod
from tests.support.binfmt.emulation import aarch64_entry, qemu_aarch64
from tests.support.kubenode.helm_install import Release, agent_pod, node_root_pid
from tests.support.kubenode.kubelet_node import NODE_NAME, Node, wait_for
from tests.support.kubenode.node_images import SIDE_FOREIGN
from tests.support.kubenode.story_workloads import ensure_namespace, handler_samples, warning_events

NS = "emulated"
EMULATOR = "execwatch-test-aarch64"
TABLE = Path("/proc/sys/fs/binfmt_misc")
LABEL = "execwatch.io/exec-failure"


def in_node_mounts(*argv: str) -> None:
    """`argv` in the node's mount namespace: where the agent (through the node's root) and
    the kernel's exec path of every container see the node's table."""
    pid = str(node_root_pid())
    subprocess.run(["nsenter", "-t", pid, "-m", "--", *argv], check=True, capture_output=True)


@contextlib.contextmanager
def node_emulator(interpreter: Path) -> Iterator[str]:
    """The node's table with an `F` arm64 entry running `interpreter`; yields its name."""
    table = f"/proc/{node_root_pid()}/root{TABLE}"
    mounted = os.path.ismount(table)
    if not mounted:
        in_node_mounts("mount", "-t", "binfmt_misc", "binfmt_misc", str(TABLE))
    entry = f"{table}/{EMULATOR}"
    try:
        if os.path.exists(entry):  # left by an interrupted run
            Path(entry).write_text("-1")
        Path(f"{table}/register").write_text(aarch64_entry(EMULATOR, interpreter, "F"))
        yield EMULATOR
    finally:
        if os.path.exists(entry):
            Path(entry).write_text("-1")
        if not mounted:
            in_node_mounts("umount", str(TABLE))
    assert not os.path.exists(entry)


def events_of(node: Node, pod: str, reason: str) -> list[client.CoreV1Event]:
    return [e for e in warning_events(node, NS, pod) if e.reason == reason]


def emulated_total(node: Node) -> float:
    return sum(
        value
        for labels, value in handler_samples(node, "execwatch_exec_failures_total")
        if labels.get("namespace") == NS and labels.get("reason") == "Emulated"
    )


def test_a_foreign_binary_run_by_the_nodes_emulator_is_reported_emulated(
    node: Node, release: Release
) -> None:
    """A side process runs an arm64 busybox every 3 s: under the node's emulator it runs,
    and execwatch says so on the pod; without it, the same exec fails with ENOEXEC."""
    interpreter = qemu_aarch64().resolve()
    ensure_namespace(node, NS)
    with node_emulator(interpreter):
        wait_for(
            "the agent watching the node's arm64 emulator",
            lambda: (
                agent_counter(
                    node, "execwatch_node_binfmt_emulators", emulated_arch="arm64", flags="F"
                )
                == 1
            ),
            60,
        )
        node.core().create_namespaced_pod(NS, side_pod("side", NS))
        (event,) = wait_for("the Emulated Event", lambda: events_of(node, "side", "Emulated"), 90)
        assert event.involved_object.field_path == "spec.containers{main}"
        assert f"ran {SIDE_FOREIGN}:" in event.message
        assert f"an arm64 binary ran under {interpreter} on this amd64 node" in event.message
        assert event.message.endswith(f"node {NODE_NAME}")
        wait_for(
            "the pod labelled Emulated",
            lambda: (
                node.core().read_namespaced_pod("side", NS).metadata.labels.get(LABEL) == "Emulated"
            ),
            15,
        )
        assert wait_for("the handler's Emulated count", lambda: emulated_total(node), 60) >= 1
        assert exec_format_events(node, NS, "side") == []
        assert (
            agent_counter(node, "execwatch_kernel_emulated_execs_total", emulated_arch="arm64") >= 1
        )

    wait_for(
        "the agent seeing the emulator gone",
        lambda: not agent_counter(node, "execwatch_node_binfmt_emulators", emulated_arch="arm64"),
        60,
    )
    (failed,) = wait_for(
        "the ExecFormatError Event", lambda: exec_format_events(node, NS, "side"), 60
    )
    assert f"could not exec {SIDE_FOREIGN} (ENOEXEC)" in failed.message
    node.core().delete_namespaced_pod("side", NS, grace_period_seconds=0)
    assert agent_pod(node).status.phase == "Running"
