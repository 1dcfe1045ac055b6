"""Workloads of the second seed's story, and how tests look at them."""

from __future__ import annotations

import contextlib
import urllib.request
from typing import Any

from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from tests.support.kubenode.kubelet_node import Node, wait_for
from tests.support.kubenode.node_images import WEB_PORT

HANDLER_COMPONENT = "execwatch.io/handler"


def container(name: str, image: str, **extra: Any) -> client.V1Container:
    return client.V1Container(name=name, image=image, image_pull_policy="Never", **extra)


def deployment(name: str, namespace: str, image: str, replicas: int = 1) -> client.V1Deployment:
    """A pod whose container dies at once can be reported Ready for an instant (running
    when the kubelet looked); min_ready_seconds keeps such a pod from counting as
    available, so a rollout to it never scales the working pods down."""
    labels = {"app": name}
    return client.V1Deployment(
        metadata=client.V1ObjectMeta(name=name, namespace=namespace),
        spec=client.V1DeploymentSpec(
            replicas=replicas,
            min_ready_seconds=10,
            selector=client.V1LabelSelector(match_labels=labels),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels),
                spec=client.V1PodSpec(
                    containers=[container(name, image)], termination_grace_period_seconds=1
                ),
            ),
        ),
    )


def ensure_namespace(node: Node, name: str) -> None:
    with contextlib.suppress(client.ApiException):
        node.core().create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    wait_for(
        f"ServiceAccount {name}/default",
        lambda: node.core().list_namespaced_service_account(name).items,
        60,
    )


def pods(node: Node, namespace: str, selector: str) -> list[client.V1Pod]:
    items: list[client.V1Pod] = (
        node.core().list_namespaced_pod(namespace, label_selector=selector).items
    )
    return items


def restarts(pod: client.V1Pod) -> int:
    return sum(s.restart_count for s in pod.status.container_statuses or [])


def http_get(pod: client.V1Pod, attempts: int = 3) -> str:
    """What the pod's web server answers on its pod IP (the host reaches the bridge); a
    connection the test network lost is tried again, up to `attempts` times 5 s."""
    url = f"http://{pod.status.pod_ip}:{WEB_PORT}/index.html"
    for _ in range(attempts - 1):
        try:
            return _get(url)
        except OSError:
            continue
    return _get(url)


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        body: bytes = r.read()
    return body.decode().strip()


def warning_events(node: Node, namespace: str, pod: str) -> list[Any]:
    """Warning Events regarding `pod` posted by execwatch's handler, read through core/v1
    (the client's events.k8s.io models refuse the kubelet's Events, which lack eventTime)."""
    events = node.core().list_namespaced_event(
        namespace,
        field_selector=(
            f"involvedObject.name={pod},type=Warning,reportingComponent={HANDLER_COMPONENT}"
        ),
    )
    return list(events.items)


def metric_samples(pod: client.V1Pod, metric: str) -> list[tuple[dict[str, str], float]]:
    """Samples of `metric` on the pod's /metrics (pod IP, its first container's port)."""
    port = pod.spec.containers[0].ports[0].container_port
    with urllib.request.urlopen(f"http://{pod.status.pod_ip}:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return [
        (dict(s.labels), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == metric
    ]


def handler_samples(node: Node, metric: str) -> list[tuple[dict[str, str], float]]:
    """Samples of `metric` on the leading handler's /metrics."""
    lease = client.CoordinationV1Api(node.client()).read_namespaced_lease(
        "execwatch-handler", "execwatch"
    )
    holder = str(lease.spec.holder_identity).split("_")[0]
    return metric_samples(node.core().read_namespaced_pod(holder, "execwatch"), metric)
