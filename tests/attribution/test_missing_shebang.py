"""A container's program with no `#!`, under real runc and containerd, through the whole
node stack: the runtime's init gives up on it (MissingShebang), a shell in the container
runs the same file (NoShebang).

runc's init execs the entrypoint once; refused with ENOEXEC it exits (`exec /app/run.sh:
exec format error`) and the container never starts. busybox sh, refused the same way,
execs itself again to run the file as a script, and the container exits 0. The stack runs
its consume loop on a thread of its own, as the agent does: records are taken while the
container still lives, or just after.
"""

from __future__ import annotations

import secrets
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from execwatch.attribution import Attributor
from execwatch.attribution.cri.client import CriContainers
from execwatch.node.stack import StackOptions
from execwatch.pipeline import PipelineOptions
from execwatch.record import AttributionStatus, ExecFailure, Reason
from tests.support.node.stack_runner import Running, node_stack
from tests.support.runtime.containerd import Containerd, oci_archive
from tests.support.runtime.runc import HOST_BUSYBOX, KubeletCgroup, Runc, remove_pod_cgroups
from tests.support.wait import wait_until

NO_SHEBANG = b"echo hello\n"
IMAGE = "docker.io/execwatch/noshebang:test"
ENTRYPOINT = "/app/run.sh"


class Stack:
    """The node stack with its consume loop running, and what it emitted."""

    def __init__(self, running: Running) -> None:
        self._running = running

    def wait_for(self, match: Callable[[ExecFailure], bool], timeout: float) -> ExecFailure:
        def found() -> ExecFailure | None:
            return next((r for r in list(self._running.records) if match(r)), None)

        def seen() -> str:
            got = [(r.event.path, str(r.diagnosis.reason)) for r in self._running.records]
            return f"saw {got[-20:]}"

        record: ExecFailure = wait_until(found, timeout, explain=seen)
        return record


def running_stack(attributor: Attributor) -> Iterator[Stack]:
    pipeline = PipelineOptions(window=0.05, show_no_shebang=True)
    options = StackOptions(pipeline=pipeline, attributor=attributor)
    with node_stack(options, loop="run") as running:
        yield Stack(running)


@pytest.fixture
def host_tracer(host_attributor: Attributor) -> Iterator[Stack]:
    yield from running_stack(host_attributor)


def runc_script(runc: Runc) -> str:
    """A no-#! file in the shared runc rootfs, named for this test alone."""
    name = f"run-{secrets.token_hex(4)}.sh"
    path = runc.rootfs / "bin" / name
    path.write_bytes(NO_SHEBANG)
    path.chmod(0o755)
    return f"/bin/{name}"


@pytest.mark.parametrize(
    ("shell", "container_exit", "reason", "comm", "fate"),
    [
        ([], 1, Reason.MISSING_SHEBANG, "runc:[2:INIT]", "exited with status 1"),
        (["/bin/sh", "-c"], 0, Reason.NO_SHEBANG, "sh", "its caller ran another program next"),
    ],
    ids=["entrypoint", "shell"],
)
def test_runc_container_whose_program_lacks_a_shebang(
    runc: Runc,
    host_tracer: Stack,
    shell: list[str],
    container_exit: int,
    reason: Reason,
    comm: str,
    fate: str,
) -> None:
    path = runc_script(runc)
    cgroup = KubeletCgroup.new("cgroupfs")
    try:
        # The entrypoint: runc says "exec format error" and the container never runs.
        # The shell: busybox runs the file itself.
        assert runc.run(cgroup, [*shell, path]) == container_exit

        record = host_tracer.wait_for(
            lambda r: r.event.path == path and r.attribution.container_id == cgroup.container_id,
            timeout=15,
        )
    finally:
        remove_pod_cgroups(cgroup.pod_path)

    assert record.diagnosis.reason is reason
    assert record.event.comm == comm
    assert record.attribution.pod_uid == cgroup.pod_uid
    detail = record.diagnosis.detail
    assert detail.startswith(
        'neither ELF nor #!: no #! interpreter line (first bytes: "echo hello\n")'
    )
    assert fate in detail


@pytest.mark.parametrize(
    ("binary", "named"),
    [
        ("hello-darwin-amd64", "a macOS x86-64 executable (Mach-O)"),
        ("hello-windows-amd64.exe", "a Windows x86-64 executable (PE)"),
    ],
    ids=["mach-o", "pe"],
)
def test_runc_container_whose_entrypoint_is_another_os_binary(
    runc: Runc, host_tracer: Stack, foreign_os: dict[str, Path], binary: str, named: str
) -> None:
    """A Go program built with GOOS=darwin or GOOS=windows as the entrypoint: runc's exec
    fails with ENOEXEC, and the failure names the OS and architecture found."""
    path = f"/bin/app-{secrets.token_hex(4)}"
    shutil.copy(foreign_os[binary], runc.rootfs / path.lstrip("/"))
    (runc.rootfs / path.lstrip("/")).chmod(0o755)
    cgroup = KubeletCgroup.new("cgroupfs")
    try:
        assert runc.run(cgroup, [path]) == 1  # exec format error
        record = host_tracer.wait_for(
            lambda r: r.event.path == path and r.attribution.container_id == cgroup.container_id,
            timeout=15,
        )
    finally:
        remove_pod_cgroups(cgroup.pod_path)

    assert record.diagnosis.reason is Reason.FOREIGN_OS
    assert record.event.comm == "runc:[2:INIT]"
    assert named in record.diagnosis.detail


@pytest.fixture(scope="module")
def noshebang_image(containerd: Containerd, tmp_path_factory: pytest.TempPathFactory) -> str:
    """An image whose entrypoint, /app/run.sh, has no #! line; busybox as /bin/sh."""
    work = tmp_path_factory.mktemp("noshebang-image")
    script = work / "run.sh"
    script.write_bytes(NO_SHEBANG)
    archive = oci_archive(
        work / "noshebang.tar",
        IMAGE,
        {"app/run.sh": script, "bin/busybox": HOST_BUSYBOX},
        {"bin/sh": "busybox"},
        [ENTRYPOINT],
    )
    containerd.import_image(archive)
    return IMAGE


@pytest.fixture
def pod_tracer(containerd: Containerd) -> Iterator[Stack]:
    with Attributor(containers=CriContainers(sockets=[containerd.socket])) as attributor:
        yield from running_stack(attributor)


@pytest.mark.parametrize(
    ("command", "reason", "comm", "fate"),
    [
        ([ENTRYPOINT], Reason.MISSING_SHEBANG, "runc:[2:INIT]", "without running anything else"),
        (["/bin/sh", "-c", ENTRYPOINT], Reason.NO_SHEBANG, "sh", "ran another program next"),
    ],
    ids=["entrypoint", "shell"],
)
def test_containerd_pod_whose_program_lacks_a_shebang(
    containerd: Containerd,
    noshebang_image: str,
    pod_tracer: Stack,
    command: list[str],
    reason: Reason,
    comm: str,
    fate: str,
) -> None:
    pod = containerd.run_pod(
        "web-6d5f8-k2k9z", namespace="shop", labels={"pod-template-hash": "6d5f8"}
    )
    try:
        cid = containerd.create_container(pod, "app", command, image=noshebang_image)

        record = pod_tracer.wait_for(
            lambda r: r.event.path == ENTRYPOINT and r.attribution.container_id == cid,
            timeout=20,
        )
    finally:
        containerd.remove_pod(pod)

    assert record.diagnosis.reason is reason
    assert record.event.comm == comm
    assert fate in record.diagnosis.detail
    assert '(first bytes: "echo hello\n")' in record.diagnosis.detail
    a = record.attribution
    assert a.status is AttributionStatus.ATTRIBUTED
    assert (a.namespace, a.pod, a.container, a.image) == ("shop", "web-6d5f8-k2k9z", "app", IMAGE)
