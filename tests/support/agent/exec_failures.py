"""ExecFailure values as the probe + attribution would hand them to the publisher."""

from __future__ import annotations

import errno
import hashlib
import time
from typing import Any

from execwatch.agent.records import RecordApi
from execwatch.kube import errors
from execwatch.record import (
    Attribution,
    AttributionStatus,
    Diagnosis,
    ExecFailed,
    ExecFailure,
    Reason,
)


def exec_failure(
    *,
    pod: dict[str, Any] | None = None,
    container: str = "app",
    path: str = "/usr/local/bin/server",
    reason: Reason = Reason.FOREIGN_ARCHITECTURE,
    binary_arch: str | None = "arm64",
    node_arch: str = "amd64",
    err: int = errno.ENOEXEC,
    comm: str = "runc:[2:INIT]",
    count: int = 1,
    when: float | None = None,
    container_id: str | None = None,
    status: AttributionStatus | None = None,
    pod_name: str | None = None,
    namespace: str | None = None,
    pod_uid: str | None = None,
) -> ExecFailure:
    meta = (pod or {}).get("metadata", {})
    name = pod_name or meta.get("name")
    ns = namespace or meta.get("namespace")
    uid = pod_uid or meta.get("uid")
    if status is None:
        status = AttributionStatus.ATTRIBUTED if name else AttributionStatus.UNATTRIBUTED
    seed = f"{ns}/{name}/{uid}/{container}"
    cid = container_id or hashlib.sha256(seed.encode()).hexdigest()
    attribution = Attribution(
        status=status,
        cgroup_path=f"/kubepods.slice/kubepods-pod{uid}.slice/cri-containerd-{cid}.scope",
        runtime="containerd",
        container_id=cid if name else None,
        pod_uid=uid,
        namespace=ns,
        pod=name,
        container=container if name else None,
        image="registry.example/app:1",
        workload_kind="Deployment" if name else None,
        workload="app" if name else None,
    )
    event = ExecFailed(
        time=when if when is not None else time.time(),
        errno=err,
        pid=4242,
        tgid=4242,
        ppid=4200,
        uid=0,
        comm=comm,
        parent_comm="containerd-shim",
        path=path,
        cgroup_id=12345,
        mntns=4026532000,
        syscall="execve",
    )
    diagnosis = Diagnosis(
        reason=reason,
        node_arch=node_arch,
        binary_arch=binary_arch,
        interpreter="/lib/ld-linux-aarch64.so.1" if binary_arch == "arm64" else None,
        detail="ELF for arm64 (EM_AARCH64)" if binary_arch else "",
    )
    return ExecFailure(event=event, diagnosis=diagnosis, attribution=attribution, count=count)


class CountingRecords(RecordApi):
    """The agent's sink, counting the creates the ResourceQuota admission refused with 409
    because it lost a race for the quota object (the publisher retries them: nothing was
    created; they were taken for "already exists", and lost, before)."""

    def __init__(self, api: Any, namespace: str) -> None:
        super().__init__(api, namespace)
        self.conflicts = 0

    def create(self, body: dict[str, Any]) -> None:
        try:
            super().create(body)
        except errors.RetryableError as err:
            self.conflicts += err.status == 409
            raise
