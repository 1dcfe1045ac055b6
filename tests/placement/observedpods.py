"""Pods that ran and failed, without a kubelet: created bound to a node, their status
written through the status subresource as a kubelet writes it (the image digest in
`imageID`), and the records the handler would count for them."""

from __future__ import annotations

import time
import uuid
from typing import Any

from kubernetes import client

from execwatch import crd
from execwatch.record import AttributionStatus, Reason

NODE = "node-a"


def running_pod(
    api: client.ApiClient,
    ns: str,
    image_id: str,
    *,
    name: str | None = None,
    owner: str | None = "ReplicaSet",
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A Running, Ready pod on NODE whose container `app` runs the image `image_id`
    (`repo@sha256:...`), owned by a controller of kind `owner` (None: a bare pod)."""
    name = name or f"app-{uuid.uuid4().hex[:8]}"
    meta: dict[str, Any] = {"name": name, "labels": dict(labels or {"app": "app"})}
    if owner:
        meta["ownerReferences"] = [{
            "apiVersion": "apps/v1", "kind": owner, "name": "app-7d9f8b6c5d",
            "uid": str(uuid.uuid4()), "controller": True,
        }]  # fmt: skip
    image = image_id.split("@", 1)[0] + ":1"
    spec = {"nodeName": NODE, "containers": [{"name": "app", "image": image}]}
    core = client.CoreV1Api(api)
    core.create_namespaced_pod(ns, {"metadata": meta, "spec": spec})
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    status = {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}],
        "containerStatuses": [{
            "name": "app", "ready": True, "restartCount": 3, "image": image,
            "imageID": image_id, "containerID": "containerd://" + uuid.uuid4().hex,
            "state": {"running": {"startedAt": now}},
        }],
    }  # fmt: skip
    got = core.patch_namespaced_pod_status(name, ns, {"status": status})
    result: dict[str, Any] = api.sanitize_for_serialization(got)
    return result


def record_of(
    pod: dict[str, Any],
    *,
    reason: Reason = Reason.FOREIGN_ARCHITECTURE,
    node_arch: str = "arm64",
    count: int = 1,
    path: str = "/opt/tool",
) -> crd.ParsedRecord:
    """The record the handler counts for a failure of the pod's container `app`."""
    meta = pod["metadata"]
    now = time.time()
    return crd.ParsedRecord(
        name=f"{NODE}-{uuid.uuid4().hex[:16]}",
        uid=str(uuid.uuid4()),
        node=NODE,
        node_arch=node_arch,
        errno="ENOEXEC",
        reason=reason,
        path=path,
        count=count,
        first_seen=now,
        last_seen=now,
        attribution=AttributionStatus.ATTRIBUTED,
        binary_arch="amd64",
        detail=f"an amd64 binary cannot run on this {node_arch} node",
        pod=meta["name"],
        namespace=meta["namespace"],
        pod_uid=meta["uid"],
        container="app",
    )
