"""Each kind of kernel event has its own type (record.py), and what the outside sees of
it stays what it was: `trace --json` and the human line, the ExecFailure custom
resource's spec, and the `errno` label of the metrics. A representative record of every
kind, decoded from the bytes the probe sends, renders exactly as EXPECTED says (written
from the flat event these types replaced, by the same code: `rendered`)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from execwatch import crd
from execwatch.node.output import human_line, json_line
from execwatch.probe import events, layout
from execwatch.record import (
    Attribution,
    AttributionStatus,
    Diagnosis,
    ExecFailure,
    Kind,
    Reason,
    UndiagnosedCause,
)

HEAD = {
    "pid": 4243,
    "ktime_ns": 5_250_000_000,
    "cgroup_id": 12345,
    "cgroup_parent_id": 12000,
    "mntns": 4026532000,
    "root_ino": 2,
    "tgid": 4242,
    "ppid": 4200,
    "uid": 1000,
    "comm": b"server",
    "parent_comm": b"containerd-shim",
    "cgroup_name": b"cri-containerd-abc.scope",
}
RECORDS: dict[str, bytes] = {
    "exec failed": layout.EXEC_FAILED.pack(
        **HEAD, err=8, filename=b"/app/server", syscall=0, dirfd=-100, root_dev=(8 << 20) | 1,
        root_path=b"rootfs/ctr/", path_flags=layout.ROOT_PATH_OK,
    ),
    "fexecve": layout.EXEC_FAILED.pack(
        **HEAD, err=2, fd_name=b"tool", syscall=1, dirfd=3, flags=0x1000, base_ino=77,
        base_dev=(8 << 20) | 1, base_path=b"tool/bin/", path_flags=layout.BASE_IN_ROOT,
    ),
    "early death by exit": layout.EARLY_DEATH.pack(
        **HEAD, age_ns=1_500_000, exe_ino=99, exe_dev=(8 << 20) | 1, exit_code=127,
        exe_flags=layout.EXE_PATH_OK, exe_path=b"ls/bin/usr/",
    ),
    "early death by signal": layout.EARLY_DEATH.pack(
        **HEAD, age_ns=2_000_000, exe_ino=99, signal=11, cause=layout.DEATH_SIGNAL,
        exe_path=b"app/",
    ),
    "emulated": layout.EMULATED.pack(
        **HEAD, filename=b"/app/arm-tool", interp=b"/usr/bin/qemu-aarch64-static", arch=b"arm64"
    ),
    "enoexec exit": layout.ENOEXEC_EXIT.pack(
        **HEAD, failed_ns=5_249_000_000, exit_code=1, execed=0
    ),
}  # fmt: skip
DIAGNOSIS = Diagnosis(
    Reason.UNDIAGNOSED,
    "amd64",
    binary_arch="arm64",
    interpreter="/lib/ld-linux-aarch64.so.1",
    detail="a detail",
    library="libc.so.6",
    symbol="memcpy",
    version="GLIBC_2.38",
    cause=UndiagnosedCause.UNEXPLAINED,
)
ATTRIBUTION = Attribution(
    status=AttributionStatus.ATTRIBUTED,
    cgroup_path="/kubepods.slice/cri-containerd-abc.scope",
    runtime="containerd",
    container_id="abc",
    pod_uid="uid-1",
    namespace="shop",
    pod="web-1",
    container="server",
    image="registry.example/app:1",
    workload_kind="Deployment",
    workload="web",
)


def rendered(raw: bytes) -> dict[str, Any]:
    """All that the outside sees of the record decoded from `raw`."""
    failure = ExecFailure(events.decode_record(raw, 1_700_000_000.0), DIAGNOSIS, ATTRIBUTION, 3)
    body = crd.to_body(
        failure, name="r1", namespace="execwatch", node="node-a", first_seen=10.0,
        last_seen=20.0, count=3,
    )  # fmt: skip
    return {
        "json": json_line(failure),
        "human": human_line(failure),
        "crd": body["spec"],
        "errno label": failure.event.status,
    }


@pytest.fixture(autouse=True)
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The human line's clock is local time: UTC here, whatever the machine's zone."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_every_kind_has_a_representative_record() -> None:
    kinds = {layout.KIND.unpack_from(raw)[0] for raw in RECORDS.values()}
    assert kinds == set(Kind)


def test_each_kind_decodes_into_its_own_type() -> None:
    for raw in RECORDS.values():
        event = events.decode_record(raw, 0.0)
        assert type(event) is events.KINDS[event.kind].event
        assert type(event).kind == layout.KIND.unpack_from(raw)[0]


@pytest.mark.parametrize("name", RECORDS)
def test_a_record_of_every_kind_renders_as_before(name: str) -> None:
    assert rendered(RECORDS[name]) == EXPECTED[name]


EXPECTED: dict[str, dict[str, Any]] = {
    "exec failed": {
        "json": '{"time": 1700000005.25, "errno": "ENOEXEC", "reason": "Undiagnosed", '
        '"path": "/app/server", "binary_arch": "arm64", "node_arch": "amd64", '
        '"interpreter": "/lib/ld-linux-aarch64.so.1", "detail": "a detail", '
        '"library": "libc.so.6", "symbol": "memcpy", "version": "GLIBC_2.38", '
        '"cause": "unexplained", "exit_code": null, "signal": null, "age_ms": '
        'null, "pid": 4242, "tid": 4243, "ppid": 4200, "comm": "server", '
        '"parent_comm": "containerd-shim", "uid": 1000, "cgroup_id": 12345, '
        '"mntns": 4026532000, "syscall": "execve", "count": 3, "cgroup_path": '
        '"/kubepods.slice/cri-containerd-abc.scope", "runtime": "containerd", '
        '"container_id": "abc", "root_fd": -1, "root_description": "", '
        '"pod_uid": "uid-1", "namespace": "shop", "pod": "web-1", "container": '
        '"server", "image": "registry.example/app:1", "workload_kind": '
        '"Deployment", "workload": "web", '
        '"image_id": null, "compose_project": null, '
        '"compose_service": null, "engine_user": null, "engine_pod": null, '
        '"attribution": "attributed"}',
        "human": "22:13:25.250 ENOEXEC Undiagnosed /app/server (arm64 on amd64) "
        "interpreter=/lib/ld-linux-aarch64.so.1 library=libc.so.6 symbol=memcpy "
        "version=GLIBC_2.38 pid=4242 ppid=4200 comm=server "
        "parent=containerd-shim uid=1000 pod=shop/web-1 container=server x3 "
        "more — a detail",
        "crd": {
            "node": "node-a",
            "nodeArch": "amd64",
            "errno": "ENOEXEC",
            "reason": "Undiagnosed",
            "detail": "a detail",
            "path": "/app/server",
            "comm": "server",
            "parentComm": "containerd-shim",
            "syscall": "execve",
            "uid": 1000,
            "firstSeen": "1970-01-01T00:00:10.000000Z",
            "lastSeen": "1970-01-01T00:00:20.000000Z",
            "count": 3,
            "attribution": "attributed",
            "binaryArch": "arm64",
            "interpreter": "/lib/ld-linux-aarch64.so.1",
            "pod": {"name": "web-1", "namespace": "shop", "uid": "uid-1"},
            "container": {
                "name": "server",
                "id": "abc",
                "image": "registry.example/app:1",
                "runtime": "containerd",
            },
            "workload": {"kind": "Deployment", "name": "web"},
        },
        "errno label": "ENOEXEC",
    },
    "fexecve": {
        "json": '{"time": 1700000005.25, "errno": "ENOENT", "reason": "Undiagnosed", "path": '
        '"tool", "binary_arch": "arm64", "node_arch": "amd64", "interpreter": '
        '"/lib/ld-linux-aarch64.so.1", "detail": "a detail", "library": "libc.so.6", '
        '"symbol": "memcpy", "version": "GLIBC_2.38", "cause": "unexplained", '
        '"exit_code": null, "signal": null, "age_ms": null, "pid": 4242, "tid": '
        '4243, "ppid": 4200, "comm": "server", "parent_comm": "containerd-shim", '
        '"uid": 1000, "cgroup_id": 12345, "mntns": 4026532000, "syscall": '
        '"execveat", "count": 3, "cgroup_path": '
        '"/kubepods.slice/cri-containerd-abc.scope", "runtime": "containerd", '
        '"container_id": "abc", "root_fd": -1, "root_description": "", "pod_uid": '
        '"uid-1", "namespace": "shop", "pod": "web-1", "container": "server", '
        '"image": "registry.example/app:1", "workload_kind": "Deployment", '
        '"workload": "web", '
        '"image_id": null, "compose_project": null, '
        '"compose_service": null, "engine_user": null, "engine_pod": null, '
        '"attribution": "attributed"}',
        "human": "22:13:25.250 ENOENT Undiagnosed tool (arm64 on amd64) "
        "interpreter=/lib/ld-linux-aarch64.so.1 library=libc.so.6 symbol=memcpy "
        "version=GLIBC_2.38 pid=4242 ppid=4200 comm=server parent=containerd-shim "
        "uid=1000 pod=shop/web-1 container=server x3 more — a detail",
        "crd": {
            "node": "node-a",
            "nodeArch": "amd64",
            "errno": "ENOENT",
            "reason": "Undiagnosed",
            "detail": "a detail",
            "path": "tool",
            "comm": "server",
            "parentComm": "containerd-shim",
            "syscall": "execveat",
            "uid": 1000,
            "firstSeen": "1970-01-01T00:00:10.000000Z",
            "lastSeen": "1970-01-01T00:00:20.000000Z",
            "count": 3,
            "attribution": "attributed",
            "binaryArch": "arm64",
            "interpreter": "/lib/ld-linux-aarch64.so.1",
            "pod": {"name": "web-1", "namespace": "shop", "uid": "uid-1"},
            "container": {
                "name": "server",
                "id": "abc",
                "image": "registry.example/app:1",
                "runtime": "containerd",
            },
            "workload": {"kind": "Deployment", "name": "web"},
        },
        "errno label": "ENOENT",
    },
    "early death by exit": {
        "json": '{"time": 1700000005.25, "errno": "EXIT127", "reason": '
        '"Undiagnosed", "path": "/usr/bin/ls", "binary_arch": "arm64", '
        '"node_arch": "amd64", "interpreter": '
        '"/lib/ld-linux-aarch64.so.1", "detail": "a detail", "library": '
        '"libc.so.6", "symbol": "memcpy", "version": "GLIBC_2.38", '
        '"cause": "unexplained", "exit_code": 127, "signal": null, '
        '"age_ms": 1.5, "pid": 4242, "tid": 4243, "ppid": 4200, "comm": '
        '"server", "parent_comm": "containerd-shim", "uid": 1000, '
        '"cgroup_id": 12345, "mntns": 4026532000, "syscall": '
        '"exit_group", "count": 3, "cgroup_path": '
        '"/kubepods.slice/cri-containerd-abc.scope", "runtime": '
        '"containerd", "container_id": "abc", "root_fd": -1, '
        '"root_description": "", "pod_uid": "uid-1", "namespace": '
        '"shop", "pod": "web-1", "container": "server", "image": '
        '"registry.example/app:1", "workload_kind": "Deployment", '
        '"workload": "web", '
        '"image_id": null, "compose_project": null, '
        '"compose_service": null, "engine_user": null, "engine_pod": null, '
        '"attribution": "attributed"}',
        "human": "22:13:25.250 EXIT127 Undiagnosed /usr/bin/ls (arm64 on amd64) "
        "interpreter=/lib/ld-linux-aarch64.so.1 library=libc.so.6 "
        "symbol=memcpy version=GLIBC_2.38 age=2ms pid=4242 ppid=4200 "
        "comm=server parent=containerd-shim uid=1000 pod=shop/web-1 "
        "container=server x3 more — a detail",
        "crd": {
            "node": "node-a",
            "nodeArch": "amd64",
            "errno": "EXIT127",
            "reason": "Undiagnosed",
            "detail": "a detail",
            "path": "/usr/bin/ls",
            "comm": "server",
            "parentComm": "containerd-shim",
            "syscall": "exit_group",
            "uid": 1000,
            "firstSeen": "1970-01-01T00:00:10.000000Z",
            "lastSeen": "1970-01-01T00:00:20.000000Z",
            "count": 3,
            "attribution": "attributed",
            "binaryArch": "arm64",
            "interpreter": "/lib/ld-linux-aarch64.so.1",
            "pod": {"name": "web-1", "namespace": "shop", "uid": "uid-1"},
            "container": {
                "name": "server",
                "id": "abc",
                "image": "registry.example/app:1",
                "runtime": "containerd",
            },
            "workload": {"kind": "Deployment", "name": "web"},
        },
        "errno label": "EXIT127",
    },
    "early death by signal": {
        "json": '{"time": 1700000005.25, "errno": "SIGSEGV", "reason": '
        '"Undiagnosed", "path": "…/app", "binary_arch": "arm64", '
        '"node_arch": "amd64", "interpreter": '
        '"/lib/ld-linux-aarch64.so.1", "detail": "a detail", '
        '"library": "libc.so.6", "symbol": "memcpy", "version": '
        '"GLIBC_2.38", "cause": "unexplained", "exit_code": null, '
        '"signal": 11, "age_ms": 2.0, "pid": 4242, "tid": 4243, '
        '"ppid": 4200, "comm": "server", "parent_comm": '
        '"containerd-shim", "uid": 1000, "cgroup_id": 12345, "mntns": '
        '4026532000, "syscall": "signal", "count": 3, "cgroup_path": '
        '"/kubepods.slice/cri-containerd-abc.scope", "runtime": '
        '"containerd", "container_id": "abc", "root_fd": -1, '
        '"root_description": "", "pod_uid": "uid-1", "namespace": '
        '"shop", "pod": "web-1", "container": "server", "image": '
        '"registry.example/app:1", "workload_kind": "Deployment", '
        '"workload": "web", '
        '"image_id": null, "compose_project": null, '
        '"compose_service": null, "engine_user": null, "engine_pod": null, '
        '"attribution": "attributed"}',
        "human": "22:13:25.250 SIGSEGV Undiagnosed …/app (arm64 on amd64) "
        "interpreter=/lib/ld-linux-aarch64.so.1 library=libc.so.6 "
        "symbol=memcpy version=GLIBC_2.38 age=2ms pid=4242 ppid=4200 "
        "comm=server parent=containerd-shim uid=1000 pod=shop/web-1 "
        "container=server x3 more — a detail",
        "crd": {
            "node": "node-a",
            "nodeArch": "amd64",
            "errno": "SIGSEGV",
            "reason": "Undiagnosed",
            "detail": "a detail",
            "path": "…/app",
            "comm": "server",
            "parentComm": "containerd-shim",
            "syscall": "signal",
            "uid": 1000,
            "firstSeen": "1970-01-01T00:00:10.000000Z",
            "lastSeen": "1970-01-01T00:00:20.000000Z",
            "count": 3,
            "attribution": "attributed",
            "binaryArch": "arm64",
            "interpreter": "/lib/ld-linux-aarch64.so.1",
            "pod": {"name": "web-1", "namespace": "shop", "uid": "uid-1"},
            "container": {
                "name": "server",
                "id": "abc",
                "image": "registry.example/app:1",
                "runtime": "containerd",
            },
            "workload": {"kind": "Deployment", "name": "web"},
        },
        "errno label": "SIGSEGV",
    },
    "emulated": {
        "json": '{"time": 1700000005.25, "errno": "EMULATED", "reason": "Undiagnosed", '
        '"path": "/app/arm-tool", "binary_arch": "arm64", "node_arch": "amd64", '
        '"interpreter": "/lib/ld-linux-aarch64.so.1", "detail": "a detail", '
        '"library": "libc.so.6", "symbol": "memcpy", "version": "GLIBC_2.38", '
        '"cause": "unexplained", "exit_code": null, "signal": null, "age_ms": null, '
        '"pid": 4242, "tid": 4243, "ppid": 4200, "comm": "server", "parent_comm": '
        '"containerd-shim", "uid": 1000, "cgroup_id": 12345, "mntns": 4026532000, '
        '"syscall": "execve", "count": 3, "cgroup_path": '
        '"/kubepods.slice/cri-containerd-abc.scope", "runtime": "containerd", '
        '"container_id": "abc", "root_fd": -1, "root_description": "", "pod_uid": '
        '"uid-1", "namespace": "shop", "pod": "web-1", "container": "server", '
        '"image": "registry.example/app:1", "workload_kind": "Deployment", '
        '"workload": "web", '
        '"image_id": null, "compose_project": null, '
        '"compose_service": null, "engine_user": null, "engine_pod": null, '
        '"attribution": "attributed"}',
        "human": "22:13:25.250 EMULATED Undiagnosed /app/arm-tool (arm64 on amd64) "
        "interpreter=/lib/ld-linux-aarch64.so.1 library=libc.so.6 symbol=memcpy "
        "version=GLIBC_2.38 pid=4242 ppid=4200 comm=server parent=containerd-shim "
        "uid=1000 pod=shop/web-1 container=server x3 more — a detail",
        "crd": {
            "node": "node-a",
            "nodeArch": "amd64",
            "errno": "EMULATED",
            "reason": "Undiagnosed",
            "detail": "a detail",
            "path": "/app/arm-tool",
            "comm": "server",
            "parentComm": "containerd-shim",
            "syscall": "execve",
            "uid": 1000,
            "firstSeen": "1970-01-01T00:00:10.000000Z",
            "lastSeen": "1970-01-01T00:00:20.000000Z",
            "count": 3,
            "attribution": "attributed",
            "binaryArch": "arm64",
            "interpreter": "/lib/ld-linux-aarch64.so.1",
            "pod": {"name": "web-1", "namespace": "shop", "uid": "uid-1"},
            "container": {
                "name": "server",
                "id": "abc",
                "image": "registry.example/app:1",
                "runtime": "containerd",
            },
            "workload": {"kind": "Deployment", "name": "web"},
        },
        "errno label": "EMULATED",
    },
    "enoexec exit": {
        "json": '{"time": 1700000005.25, "errno": "ENOEXEC_EXIT", "reason": '
        '"Undiagnosed", "path": "", "binary_arch": "arm64", "node_arch": '
        '"amd64", "interpreter": "/lib/ld-linux-aarch64.so.1", "detail": "a '
        'detail", "library": "libc.so.6", "symbol": "memcpy", "version": '
        '"GLIBC_2.38", "cause": "unexplained", "exit_code": 1, "signal": null, '
        '"age_ms": 1.0, "pid": 4242, "tid": 4243, "ppid": 4200, "comm": '
        '"server", "parent_comm": "containerd-shim", "uid": 1000, "cgroup_id": '
        '12345, "mntns": 4026532000, "syscall": "exit_group", "count": 3, '
        '"cgroup_path": "/kubepods.slice/cri-containerd-abc.scope", "runtime": '
        '"containerd", "container_id": "abc", "root_fd": -1, '
        '"root_description": "", "pod_uid": "uid-1", "namespace": "shop", '
        '"pod": "web-1", "container": "server", "image": '
        '"registry.example/app:1", "workload_kind": "Deployment", "workload": '
        '"web", '
        '"image_id": null, "compose_project": null, '
        '"compose_service": null, "engine_user": null, "engine_pod": null, '
        '"attribution": "attributed"}',
        "human": "22:13:25.250 ENOEXEC_EXIT Undiagnosed  (arm64 on amd64) "
        "interpreter=/lib/ld-linux-aarch64.so.1 library=libc.so.6 "
        "symbol=memcpy version=GLIBC_2.38 age=1ms pid=4242 ppid=4200 "
        "comm=server parent=containerd-shim uid=1000 pod=shop/web-1 "
        "container=server x3 more — a detail",
        "crd": {
            "node": "node-a",
            "nodeArch": "amd64",
            "errno": "ENOEXEC_EXIT",
            "reason": "Undiagnosed",
            "detail": "a detail",
            "path": "?",
            "comm": "server",
            "parentComm": "containerd-shim",
            "syscall": "exit_group",
            "uid": 1000,
            "firstSeen": "1970-01-01T00:00:10.000000Z",
            "lastSeen": "1970-01-01T00:00:20.000000Z",
            "count": 3,
            "attribution": "attributed",
            "binaryArch": "arm64",
            "interpreter": "/lib/ld-linux-aarch64.so.1",
            "pod": {"name": "web-1", "namespace": "shop", "uid": "uid-1"},
            "container": {
                "name": "server",
                "id": "abc",
                "image": "registry.example/app:1",
                "runtime": "containerd",
            },
            "workload": {"kind": "Deployment", "name": "web"},
        },
        "errno label": "ENOEXEC_EXIT",
    },
}
