"""The node agent's loop: the node stack (probe, diagnosis, attribution, folding) into the
publisher. Kept apart from the CLI so the end-to-end test runs exactly this code."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry

from execwatch.agent.publisher import Publisher

if TYPE_CHECKING:
    from execwatch.pipeline import Heartbeat

log = logging.getLogger(__name__)
NODE_WINDOW_S = 1.0  # a window of the consume loop: a flush, and a kernel fold epoch


def pod_cache(node: str, rest: Any, registry: CollectorRegistry | None = None) -> Any:
    """A node-scoped pod watch for attribution (`--pod-metadata=api`), over the agent's
    client (`kube.client.Rest`).

    Needs deploy/base/optional/agent-pod-reader.yaml: it fills pod and container names
    when the container runtime cannot (containers it does not know, already gone)."""
    from execwatch.attribution.kube import KubernetesPodCache

    return KubernetesPodCache(node, rest=rest, registry=registry)


def run(
    publisher: Publisher,
    attributor: Any,
    stop: threading.Event,
    *,
    registry: CollectorRegistry,
    ready: threading.Event | None = None,
    heartbeat: Heartbeat | None = None,
    host_root: Path = Path("/"),
) -> float:
    """Trace failed execs and publish them until `stop`; needs root and BPF.

    One repeat window to choose, the publisher's `aggregation_window`. The node folds
    repeats over a fixed NODE_WINDOW_S first (the kernel too), so the publisher sees a
    storm as one submit a second, and the first occurrence at once. `host_root` is the
    node's root, where its binfmt_misc table is read (probe.nodebinfmt).

    Returns the CLOCK_BOOTTIME before which every event of the probe was consumed and
    submitted: what this agent hands over to the next one on the node."""
    from execwatch.node.stack import NodeStack, StackOptions
    from execwatch.pipeline import PipelineOptions
    from execwatch.probe.loader import ProbeOptions

    options = StackOptions(
        probe=ProbeOptions(host_root=host_root),
        pipeline=PipelineOptions(window=NODE_WINDOW_S),
        attributor=attributor,
        heartbeat=heartbeat,
        registry=registry,
    )
    with NodeStack.open(options, publisher.submit) as stack:
        log.info("agent tracing", extra={"kv": {"node": publisher.config.node}})
        if ready is not None:
            ready.set()
        source = _PollClock(stack.probe)
        stack.run(stop, source=source)
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
