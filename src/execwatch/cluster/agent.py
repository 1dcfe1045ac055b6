"""The node agent's loop: probe -> node pipeline (diagnosis, attribution, folding) ->
publisher. Kept apart from the CLI so the end-to-end test runs exactly this code."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry

from execwatch.cluster.publisher import Publisher

if TYPE_CHECKING:
    from execwatch.pipeline import Heartbeat

log = logging.getLogger(__name__)


def pod_cache(node: str, api_client: Any) -> Any:
    """A node-scoped pod watch for attribution (`--pod-metadata=api`).

    Needs deploy/base/optional/agent-pod-reader.yaml: it fills pod and container names
    when the container runtime cannot (containers it does not know, already gone)."""
    from kubernetes import client, watch

    from execwatch.attribution.kube import KubernetesPodCache

    return KubernetesPodCache(
        node,
        core_api=client.CoreV1Api(api_client),
        apps_api=client.AppsV1Api(api_client),
        batch_api=client.BatchV1Api(api_client),
        watch_stream=watch.Watch().stream,
    )


def run(
    publisher: Publisher,
    attributor: Any,
    stop: threading.Event,
    *,
    registry: CollectorRegistry,
    window: float = 1.0,
    ready: threading.Event | None = None,
    heartbeat: Heartbeat | None = None,
) -> None:
    """Trace failed execs and publish them until `stop`; needs root and BPF."""
    from execwatch.diagnosis import FileDiagnoser
    from execwatch.diagnosis.budget import SlowMounts
    from execwatch.metrics import NodeMetrics
    from execwatch.pipeline import CountsPruner, NodePipeline
    from execwatch.probe import Probe
    from execwatch.probe.events import boot_to_epoch_offset

    with Probe() as probe:
        node_metrics = NodeMetrics(registry, probe)
        slow = SlowMounts()
        pipeline = NodePipeline(
            FileDiagnoser.for_host(attributor, slow),
            publisher.submit,
            epoch_offset=boot_to_epoch_offset(),
            attributor=attributor,
            observer=node_metrics,
            window=window,
            slow=slow,
            heartbeat=heartbeat,
        )
        probe.open_ring_buffer(pipeline.on_record)
        log.info("agent tracing", extra={"kv": {"node": publisher.config.node}})
        if ready is not None:
            ready.set()
        with CountsPruner(probe, attributor.cgroup_alive):
            pipeline.run(probe, stop)
