"""The node agent's loop: probe -> node pipeline (diagnosis, attribution, folding) ->
publisher. Kept apart from the CLI so the end-to-end test runs exactly this code."""

from __future__ import annotations

import logging
import threading
from typing import Any

from prometheus_client import CollectorRegistry

from execwatch.cluster.publisher import Publisher

log = logging.getLogger(__name__)


def pod_cache(node: str, api: Any) -> Any:
    """A node-scoped pod watch for attribution (`--pod-metadata=api`), over the agent's
    lightkube client (`cluster.kubeapi`).

    Needs deploy/base/optional/agent-pod-reader.yaml: it fills pod and container names
    when the container runtime cannot (containers it does not know, already gone)."""
    from execwatch.attribution.kube import KubernetesPodCache
    from execwatch.cluster.kubeapi import PodApi

    pods = PodApi(api)
    return KubernetesPodCache(
        node, core_api=pods, apps_api=pods, batch_api=pods, watch_stream=pods.watch_stream
    )


def run(
    publisher: Publisher,
    attributor: Any,
    stop: threading.Event,
    *,
    registry: CollectorRegistry,
    window: float = 1.0,
    ready: threading.Event | None = None,
) -> None:
    """Trace failed execs and publish them until `stop`; needs root and BPF."""
    from execwatch.diagnosis import FileDiagnoser
    from execwatch.metrics import NodeMetrics
    from execwatch.pipeline import NodePipeline
    from execwatch.probe import Probe
    from execwatch.probe.events import boot_to_epoch_offset

    with Probe() as probe:
        node_metrics = NodeMetrics(registry, probe)
        pipeline = NodePipeline(
            FileDiagnoser.for_host(attributor),
            publisher.submit,
            epoch_offset=boot_to_epoch_offset(),
            attributor=attributor,
            observer=node_metrics,
            window=window,
        )
        probe.open_ring_buffer(pipeline.on_record)
        log.info("agent tracing", extra={"kv": {"node": publisher.config.node}})
        if ready is not None:
            ready.set()
        pipeline.run(probe, stop)
