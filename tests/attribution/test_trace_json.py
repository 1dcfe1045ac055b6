"""End to end: `execwatch trace --json` names the pod of a container that died at once."""

from __future__ import annotations

import os
from pathlib import Path

from tests.support.node.trace_process import running_trace
from tests.support.runtime.containerd import APP_IMAGE, Containerd
from tests.support.runtime.runc import FOREIGN_BUSYBOX


def test_trace_json_carries_pod_container_image_and_workload(
    containerd: Containerd, tmp_path: Path
) -> None:
    env = {**os.environ, "EXECWATCH_CRI_SOCKETS": str(containerd.socket)}
    pod = None
    with running_trace(env, tmp_path / "trace.log") as trace:
        try:
            assert trace.wait_for({"path": str(FOREIGN_BUSYBOX)})["attribution"] == "host"

            pod = containerd.run_pod(
                "api-6f7c9d8b4-q8w2e", namespace="prod", labels={"pod-template-hash": "6f7c9d8b4"}
            )
            foreign = containerd.foreign_path(pod)
            cid = containerd.create_container(pod, "server", [foreign, "--help"])
            record = trace.wait_for({"path": foreign})

            assert record["errno"] == "ENOEXEC"
            assert record["attribution"] == "attributed"
            assert record["container_id"] == cid
            assert record["pod_uid"] == pod.uid
            assert (record["namespace"], record["pod"], record["container"]) == (
                "prod",
                "api-6f7c9d8b4-q8w2e",
                "server",
            )
            assert record["image"] == APP_IMAGE
            assert (record["workload_kind"], record["workload"]) == ("Deployment", "api")
            assert record["runtime"] == "containerd"
        finally:
            if pod is not None:
                containerd.remove_pod(pod)
