"""Scrape targets without a kubelet: the Pod, Endpoints and EndpointSlice objects the
kubelet and kube-controller-manager would make for one replica of a chart workload,
pointing at a port of this machine where real execwatch code serves its metrics.

Endpoints and EndpointSlices refuse loopback addresses, so the port is on this machine's
first global IPv4 address (what a pod IP is to Prometheus: an address it can reach)."""

from __future__ import annotations

import json
import subprocess
import uuid
from dataclasses import dataclass
from typing import Any

from kubernetes import client

Doc = dict[str, Any]


def local_address() -> str:
    """This machine's first global IPv4 address; a loud failure if it has none."""
    out = subprocess.run(
        ["ip", "-j", "-4", "addr", "show", "scope", "global"],
        capture_output=True,
        text=True,
        check=True,
        timeout=10,
    )
    for link in json.loads(out.stdout):
        for info in link.get("addr_info", []):
            return str(info["local"])
    raise RuntimeError("no global IPv4 address: Endpoints cannot name a loopback address")


@dataclass(frozen=True)
class Target:
    """One replica of `service`'s workload, served at address:port."""

    service: Doc  # the chart's Service
    template: Doc  # the chart's pod template (Deployment or DaemonSet)
    pod: str
    node: str
    address: str
    port: int

    @property
    def namespace(self) -> str:
        name: str = self.service["metadata"]["namespace"]
        return name

    @property
    def container(self) -> str:
        """The container whose port is named like the Service's target port."""
        port_name = self.service["spec"]["ports"][0]["targetPort"]
        for c in self.template["spec"]["containers"]:
            if any(p.get("name") == port_name for p in c.get("ports", [])):
                name: str = c["name"]
                return name
        raise AssertionError(f"no container of the template has a port {port_name!r}")


def expose(api: client.ApiClient, target: Target) -> None:
    """Create the Pod (Running at target.address, its metrics port at target.port), then
    the Service's Endpoints and EndpointSlice naming it."""
    core = client.CoreV1Api(api)
    containers = []
    for c in target.template["spec"]["containers"]:
        ports = [
            {**p, "containerPort": target.port} if p.get("name") == "metrics" else p
            for p in c.get("ports", [])
        ]
        containers.append({"name": c["name"], "image": c["image"], "ports": ports})
    pod = core.create_namespaced_pod(
        target.namespace,
        {
            "metadata": {"name": target.pod, "labels": target.template["metadata"]["labels"]},
            "spec": {"nodeName": target.node, "containers": containers},
        },
    )
    _mark_running(core, target, [c["name"] for c in containers])
    ref = {
        "kind": "Pod",
        "namespace": target.namespace,
        "name": target.pod,
        "uid": pod.metadata.uid,
    }
    service = target.service["metadata"]["name"]
    port = {"name": target.service["spec"]["ports"][0]["name"], "port": target.port}
    core.create_namespaced_endpoints(
        target.namespace,
        {
            "metadata": {"name": service},
            "subsets": [
                {
                    "addresses": [
                        {"ip": target.address, "nodeName": target.node, "targetRef": ref}
                    ],
                    "ports": [{**port, "protocol": "TCP"}],
                }
            ],
        },
    )
    client.DiscoveryV1Api(api).create_namespaced_endpoint_slice(
        target.namespace,
        {
            "metadata": {
                "name": f"{service}-{uuid.uuid4().hex[:5]}",
                "labels": {"kubernetes.io/service-name": service},
            },
            "addressType": "IPv4",
            "endpoints": [
                {
                    "addresses": [target.address],
                    "conditions": {"ready": True},
                    "nodeName": target.node,
                    "targetRef": ref,
                }
            ],
            "ports": [{**port, "protocol": "TCP"}],
        },
    )


def _mark_running(core: client.CoreV1Api, target: Target, containers: list[str]) -> None:
    core.patch_namespaced_pod_status(
        target.pod,
        target.namespace,
        {
            "status": {
                "phase": "Running",
                "podIP": target.address,
                "podIPs": [{"ip": target.address}],
                "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [
                    {
                        "name": c,
                        "ready": True,
                        "restartCount": 0,
                        "image": "execwatch:test",
                        "imageID": "",
                        "containerID": f"containerd://{uuid.uuid4().hex}",
                        "state": {"running": {}},
                    }
                    for c in containers
                ],
            }
        },
    )
