"""Failures in Docker containers, with Debian's dockerd and the real probe: each is named
(container, image, Compose labels) and diagnosed from the engine's storage, even when the
container was started with --rm and is gone within milliseconds."""

from __future__ import annotations

import errno
import os
import secrets
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from execwatch.attribution import Attributor
from execwatch.attribution.engines import Engines, EngineSocket
from execwatch.diagnosis import FileDiagnoser
from execwatch.record import ExecFailed, Reason
from tests.support.engines import unified_cgroup
from tests.support.engines.dockerd import Dockerd
from tests.support.kubenode.node_images import (
    SIDE_NOSHEBANG,
    SIDE_SCRIPT,
    WEB_V2_ARM64,
    WEB_V2_MUSL,
)
from tests.support.node.trace_process import Trace, running_trace
from tests.support.runtime.runc import FOREIGN_BUSYBOX


@pytest.fixture(scope="module")
def trace(dockerd: Dockerd, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Trace]:
    log = tmp_path_factory.mktemp("trace") / "trace.log"
    with running_trace(dockerd.env, log) as running:
        yield running


def run_all(dockerd: Dockerd, runs: dict[str, list[str]]) -> None:
    """`docker run --rm --name NAME ARGS...` of each, at once; their exit is not the point."""
    with ThreadPoolExecutor(len(runs)) as pool:
        for _ in pool.map(
            lambda item: dockerd.docker("run", "--rm", "--name", item[0], *item[1], check=False),
            runs.items(),
        ):
            pass


def image_id(dockerd: Dockerd, image: str) -> str:
    return dockerd.docker("image", "inspect", "--format", "{{.Id}}", image).stdout.strip()


def test_each_failure_names_its_container_and_image_and_is_diagnosed(
    dockerd: Dockerd, trace: Trace
) -> None:
    tag = secrets.token_hex(3)
    arm64, musl, benign = f"arm64-{tag}", f"musl-{tag}", f"benign-{tag}"
    compose = ["-l", "com.docker.compose.project=shop", "-l", "com.docker.compose.service=web"]
    run_all(
        dockerd,
        {
            arm64: [WEB_V2_ARM64],
            musl: [*compose, WEB_V2_MUSL],
            benign: ["--entrypoint", "/bin/sh", SIDE_NOSHEBANG, "-c", SIDE_SCRIPT],
        },
    )

    foreign = trace.wait_for({"container": arm64})
    assert foreign["reason"] == "ForeignArchitecture", foreign
    assert foreign["binary_arch"] == "arm64"
    assert (foreign["image"], foreign["image_id"]) == (
        WEB_V2_ARM64,
        image_id(dockerd, WEB_V2_ARM64),
    )
    assert foreign["runtime"] == "docker"
    assert foreign["attribution"] == "host"
    assert len(foreign["container_id"]) == 64
    assert foreign["compose_project"] is None

    loader = trace.wait_for({"container": musl})
    assert loader["reason"] == "MissingInterpreter", loader
    assert loader["interpreter"] == "/lib64/ld-linux-x86-64.so.2"
    assert loader["image"] == WEB_V2_MUSL
    assert (loader["compose_project"], loader["compose_service"]) == ("shop", "web")

    # --rm: both were removed within milliseconds of their failure, and still named.
    for name in (arm64, musl):
        assert dockerd.docker("container", "inspect", name, check=False).returncode != 0
    trace.wait_attached()  # a later record: the benign one's would have come before
    ours = [r for r in trace.drain() if r.get("container") in (arm64, musl, benign)]
    assert {r["container"] for r in ours} == {arm64, musl}
    assert all(r["reason"] != "Undiagnosed" for r in ours), ours


def test_a_container_gone_at_once_is_named_by_its_events(dockerd: Dockerd, trace: Trace) -> None:
    """Created, failed and removed faster than any poll: only the events stream saw it."""
    names = [f"gone-{secrets.token_hex(3)}" for _ in range(3)]
    run_all(dockerd, {name: [WEB_V2_ARM64] for name in names})
    for name in names:
        record = trace.wait_for({"container": name})
        assert (record["reason"], record["image"]) == ("ForeignArchitecture", WEB_V2_ARM64)


def test_a_stopped_daemon_leaves_the_tracer_reporting_by_id(
    tmp_path_factory: pytest.TempPathFactory, workload_archives: dict[str, Path]
) -> None:
    daemon = Dockerd(tmp_path_factory.mktemp("dockerd-stopped"))
    log = tmp_path_factory.mktemp("trace") / "trace.log"
    try:
        daemon.start()
        daemon.load_oci(workload_archives[WEB_V2_ARM64], WEB_V2_ARM64)
        with running_trace(daemon.env, log) as trace:
            daemon.docker("run", "--rm", "--name", "before-stop", WEB_V2_ARM64, check=False)
            assert trace.wait_for({"container": "before-stop"})["image"] == WEB_V2_ARM64
            daemon.stop()
            container_id = secrets.token_hex(32)
            fail_in_docker_cgroup(container_id)
            record = trace.wait_for({"container_id": container_id})
            assert trace.process.poll() is None
    finally:
        daemon.stop()
    assert record["attribution"] == "host"
    assert (record["runtime"], record["cgroup_path"]) == ("docker", f"/docker/{container_id}")
    assert record["container"] is None
    assert record["reason"] == "ForeignArchitecture"


def fail_in_docker_cgroup(container_id: str) -> None:
    """A task in a cgroup laid out as Docker's cgroupfs driver does, exec'ing an arm64 binary."""
    cgroup = unified_cgroup(f"/docker/{container_id}")
    cgroup.mkdir(parents=True)
    try:
        script = f"echo $$ > {cgroup}/cgroup.procs && exec {FOREIGN_BUSYBOX} true"
        subprocess.run(["/bin/sh", "-c", script], check=False)
    finally:
        os.rmdir(cgroup)


def test_a_removed_container_is_diagnosed_from_its_image_layers(
    dockerd: Dockerd, trace: Trace
) -> None:
    """No task, mount or container left: the root is stood up from the layers the engine
    named at create (what `trace` falls back on when the container went faster than it)."""
    engines = Engines([EngineSocket("docker", str(dockerd.socket))])
    with Attributor(engines=engines) as attributor:
        engines.wait_ready(10)
        name = f"layers-{secrets.token_hex(3)}"
        dockerd.docker("run", "--rm", "--name", name, WEB_V2_ARM64, check=False)
        record = trace.wait_for({"container": name})
        assert dockerd.docker("container", "inspect", name, check=False).returncode != 0
        event = gone_caller(record)
        diagnoser = FileDiagnoser.for_host(attributor)
        prepared = diagnoser.prepare(event)
        try:
            assert "image layers of container" in prepared.root_description
            diagnosis = diagnoser.diagnose(prepared)
        finally:
            os.close(prepared.root_fd)
    assert (diagnosis.reason, diagnosis.binary_arch) == (Reason.FOREIGN_ARCHITECTURE, "arm64")


def gone_caller(record: dict[str, Any]) -> ExecFailed:
    """The probe's record of a failed exec, its caller and the caller's parent long gone."""
    return ExecFailed(
        time=record["time"],
        errno=errno.ENOEXEC,
        pid=record["tid"],
        tgid=record["tid"],
        ppid=record["ppid"],
        uid=0,
        comm=record["comm"],
        parent_comm=record["parent_comm"],
        path=record["path"],
        cgroup_id=record["cgroup_id"],
        mntns=record["mntns"],
        syscall=record["syscall"],
    )


def test_closing_does_not_wait_for_the_events_window(dockerd: Dockerd) -> None:
    engines = Engines([EngineSocket("docker", str(dockerd.socket))])
    engines.start()
    engines.wait_ready(10)
    time.sleep(0.5)  # inside an events stream
    began = time.monotonic()
    engines.close()
    assert time.monotonic() - began < 1.0
