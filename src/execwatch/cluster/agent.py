"""The node agent's loop: probe -> node pipeline (diagnosis, attribution, folding) ->
publisher. Kept apart from the CLI so the end-to-end test runs exactly this code."""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry

from execwatch.cluster.publisher import Publisher

if TYPE_CHECKING:
    from execwatch.pipeline import Heartbeat

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
    heartbeat: Heartbeat | None = None,
) -> float:
    """Trace failed execs and publish them until `stop`; needs root and BPF.

    Returns the CLOCK_BOOTTIME before which every event of the probe was consumed and
    submitted: what this agent hands over to the next one on the node."""
    from execwatch.diagnosis import FileDiagnoser
    from execwatch.diagnosis.budget import SlowMounts
    from execwatch.metrics import NodeMetrics
    from execwatch.pipeline import CountsPruner, NodePipeline
    from execwatch.probe import Probe
    from execwatch.probe.events import boot_to_epoch_offset
    from execwatch.probe.loader import ProbeOptions

    with Probe(ProbeOptions(fold_window_ms=window * 1000)) as probe:
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
            folds=probe,
        )
        probe.open_ring_buffer(pipeline.on_record)
        log.info("agent tracing", extra={"kv": {"node": publisher.config.node}})
        if ready is not None:
            ready.set()
        source = _PollClock(probe)
        with CountsPruner(probe, attributor.cgroup_alive):
            pipeline.run(source, stop)
        return source.consumed_until


class _PollClock:
    """The probe as the pipeline polls it, remembering when the last poll began: every
    event the kernel committed before that was consumed by that poll. The margin keeps an
    event whose timestamp was taken just before, but committed just after, on the side of
    being published twice rather than never."""

    MARGIN = 0.01

    def __init__(self, probe: Any) -> None:
        self._probe = probe
        self.consumed_until = 0.0

    def poll(self, timeout_ms: int) -> int:
        started = time.clock_gettime(time.CLOCK_BOOTTIME) - self.MARGIN
        n: int = self._probe.poll(timeout_ms)
        self.consumed_until = started
        return n
