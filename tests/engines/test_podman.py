"""Failures in Podman containers (Debian's podman, rootful), named through its
Docker-compatible service and diagnosed, even started with --rm and gone at once."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support.engines.podman import Podman, RootlessPodman
from tests.support.kubenode.node_images import (
    SIDE_NOSHEBANG,
    SIDE_SCRIPT,
    WEB_V2_ARM64,
    WEB_V2_MUSL,
)
from tests.support.node.trace_process import Trace, running_trace


@pytest.fixture(scope="module")
def trace(
    podman: Podman, rootless_podman: RootlessPodman, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Trace]:
    """Started after both services: the rootless one is found at /run/user/UID/podman."""
    env = {**os.environ, "EXECWATCH_PODMAN_SOCKET": str(podman.socket)}
    with running_trace(env, tmp_path_factory.mktemp("trace") / "trace.log") as running:
        yield running


def test_each_failure_names_its_podman_container_and_is_diagnosed(
    podman: Podman, trace: Trace
) -> None:
    tag = secrets.token_hex(3)
    arm64, musl, benign = f"arm64-{tag}", f"musl-{tag}", f"benign-{tag}"
    runs = {
        arm64: [WEB_V2_ARM64],
        musl: ["-l", "com.docker.compose.project=shop", WEB_V2_MUSL],
        benign: ["--entrypoint", "/bin/sh", SIDE_NOSHEBANG, "-c", SIDE_SCRIPT],
    }
    with ThreadPoolExecutor(len(runs)) as pool:
        list(pool.map(lambda item: podman.run(item[0], *item[1]), runs.items()))

    foreign = trace.wait_for({"container": arm64})
    assert (foreign["reason"], foreign["binary_arch"]) == ("ForeignArchitecture", "arm64")
    assert (foreign["runtime"], foreign["attribution"]) == ("podman", "host")
    assert foreign["image"] == WEB_V2_ARM64
    image_id = podman.podman("image", "inspect", "--format", "{{.Id}}", WEB_V2_ARM64).stdout
    assert foreign["image_id"] and foreign["image_id"].endswith(image_id.strip())
    assert foreign["engine_user"] is None  # rootful

    loader = trace.wait_for({"container": musl})
    assert loader["reason"] == "MissingInterpreter", loader
    assert (loader["image"], loader["compose_project"]) == (WEB_V2_MUSL, "shop")

    for name in (arm64, musl):  # --rm: gone, and named all the same
        assert podman.podman("container", "exists", name, check=False).returncode == 1
    trace.wait_attached()  # a later record: the benign one's would have come before
    ours = [r for r in trace.drain() if r.get("container") in runs]
    assert {r["container"] for r in ours} == {arm64, musl}
    assert all(r["reason"] != "Undiagnosed" for r in ours), ours


def test_a_failure_in_a_podman_pod_names_its_pod(podman: Podman, trace: Trace) -> None:
    tag = secrets.token_hex(3)
    pod, name = f"pod-{tag}", f"inpod-{tag}"
    pod_id = podman.pod_create(pod)
    podman.run(name, "--pod", pod, WEB_V2_ARM64)
    record = trace.wait_for({"container": name, "path": "/bin/server"})
    assert (record["reason"], record["binary_arch"]) == ("ForeignArchitecture", "arm64"), record
    assert (record["runtime"], record["image"]) == ("podman", WEB_V2_ARM64)
    assert record["engine_pod"] == pod
    assert record["pod"] is None  # the Kubernetes pod's field
    assert f"/{pod_id}/libpod-" in record["cgroup_path"]


def test_a_rootless_users_container_is_named_with_its_user(
    rootless_podman: RootlessPodman, trace: Trace
) -> None:
    name = f"rootless-{secrets.token_hex(3)}"
    rootless_podman.run(name, WEB_V2_ARM64)
    record = trace.wait_for({"container": name, "path": "/bin/server"})
    assert (record["reason"], record["binary_arch"]) == ("ForeignArchitecture", "arm64"), record
    assert (record["runtime"], record["engine_user"]) == ("podman", rootless_podman.user)
    assert record["image"] == WEB_V2_ARM64
    uid = rootless_podman.uid
    assert f"/user@{uid}.service/user.slice/libpod-" in record["cgroup_path"]
    assert rootless_podman.podman("container", "exists", name, check=False).returncode == 1


def test_without_a_service_podman_containers_are_named_from_its_storage(
    podman: Podman, tmp_path: Path
) -> None:
    """No socket (EXECWATCH_PODMAN_SOCKET names none): containers/storage's own state."""
    env = {
        **os.environ,
        "EXECWATCH_PODMAN_SOCKET": str(tmp_path / "absent.sock"),
        "EXECWATCH_PODMAN_STORAGE": str(podman.graph_root),
    }
    with running_trace(env, tmp_path / "trace.log") as trace:
        name = f"stateonly-{secrets.token_hex(3)}"
        podman.run(name, WEB_V2_ARM64)
        record = trace.wait_for({"container": name, "path": "/bin/server"})
    assert (record["reason"], record["runtime"]) == ("ForeignArchitecture", "podman"), record
    assert record["image"] == WEB_V2_ARM64
    image_id = podman.podman("image", "inspect", "--format", "{{.Id}}", WEB_V2_ARM64).stdout
    assert record["image_id"] == image_id.strip()
