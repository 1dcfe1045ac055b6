"""The node stack: probe -> node pipeline -> sink, with the diagnoser, the metrics and the
pruner of the kernel's per-cgroup counts. `execwatch trace`, the agent, the tests and the
benchmarks all assemble it here, so each runs the code the others run.

Assembly order: the probe (loaded and attached), the metrics over its counters, the
diagnoser, the pipeline (its diagnosis worker processes), then the ring buffer into the
pipeline. Teardown is the reverse: the pipeline drains and stops its workers while the
probe still exists, then the probe is detached. The attributor is the caller's (the agent
builds it with a pod watch): it must outlive the stack.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from execwatch.attribution import Attributor
from execwatch.diagnosis import FileDiagnoser
from execwatch.diagnosis.budget import SlowMounts
from execwatch.node.metrics import NodeMetrics
from execwatch.pipeline import (
    CountsPruner,
    Diagnoser,
    Heartbeat,
    KernelFolds,
    NodePipeline,
    PipelineObserver,
    PipelineOptions,
    RecordSource,
    Sink,
)
from execwatch.probe import Probe
from execwatch.probe.events import boot_to_epoch_offset
from execwatch.probe.fairness import with_pods
from execwatch.probe.loader import ProbeOptions

RecordTap = Callable[[bytes, Callable[[bytes], None]], None]


@dataclass(frozen=True)
class StackOptions:
    """What a caller chooses. `pipeline.window` is the one repeat window: the kernel folds
    a PATH search's misses over the same window. `probe.death_window_ms` is the one
    death window: the pipeline waits as long for a caller's fate.
    The rest replace a part of the stack (tests, benchmarks): `diagnoser` the
    FileDiagnoser, `observer` the NodeMetrics, `folds` what reads the kernel's folds,
    `tap` sees each raw record and passes it on."""

    probe: ProbeOptions = field(default_factory=ProbeOptions)
    pipeline: PipelineOptions = field(default_factory=PipelineOptions)
    kernel_folds: bool = True  # False: the kernel sends every miss (a benchmark's baseline)
    attributor: Attributor | None = None  # the caller's, running: it outlives the stack
    # Or one the stack makes once the probe is loaded (a probe that cannot load is the
    # first and only error) and closes after the pipeline stops.
    make_attributor: Callable[[], Attributor] | None = None
    heartbeat: Heartbeat | None = None
    registry: CollectorRegistry | None = None
    # A call held by the kernel this long makes its mount suspect (None: SlowMounts' own)
    suspect_after: float | None = None
    diagnoser: Diagnoser | None = None
    observer: PipelineObserver | None = None
    folds: Callable[[Probe], KernelFolds] | None = None
    tap: RecordTap | None = None


@dataclass
class NodeStack:
    """An assembled stack; see NodeStack.open."""

    probe: Probe
    pipeline: NodePipeline
    registry: CollectorRegistry
    attributor: Attributor | None = None

    @classmethod
    @contextmanager
    def open(cls, options: StackOptions, sink: Sink) -> Iterator[NodeStack]:
        """Load the probe and start the pipeline into `sink`; on exit, drain the pipeline
        and stop its workers, then detach the probe."""
        fold_window = options.pipeline.window if options.kernel_folds else 0.0
        with (
            Probe(options.probe, fold_window_s=fold_window) as probe,
            _attribution(options) as attributor,
        ):
            if attributor is not None:  # a crowding cgroup is logged with its pod
                probe.describe_cgroups_with(with_pods(attributor.resolve))
            registry = options.registry if options.registry is not None else CollectorRegistry()
            slow = (
                SlowMounts()
                if options.suspect_after is None
                else SlowMounts(suspect_after=options.suspect_after)
            )
            observer = options.observer or NodeMetrics(registry, probe)
            try:
                with NodePipeline(
                    options.diagnoser or FileDiagnoser.for_host(attributor, slow),
                    sink,
                    options.pipeline,
                    epoch_offset=boot_to_epoch_offset(),
                    attributor=attributor,
                    observer=observer,
                    slow=slow,
                    heartbeat=options.heartbeat,
                    folds=options.folds(probe) if options.folds else probe,
                    death_window=options.probe.death_window_ms / 1000,
                ) as pipeline:
                    tap, on_record = options.tap, pipeline.on_record
                    on = on_record if tap is None else lambda r: tap(r, on_record)
                    probe.open_ring_buffer(on)
                    yield cls(probe, pipeline, registry, attributor)
            finally:  # the registry may outlive the probe: its maps are gone with it
                if isinstance(observer, NodeMetrics):
                    observer.detach_kernel()

    @property
    def heartbeat(self) -> Heartbeat:
        return self.pipeline.heartbeat

    def run(
        self,
        stop: threading.Event,
        deadline: float | None = None,
        source: RecordSource | None = None,
    ) -> None:
        """The consume loop (see NodePipeline.run) on `source` (the probe itself unless
        given), with the kernel's counts of removed cgroups pruned meanwhile."""
        attributor = self.attributor
        alive = attributor.cgroup_alive if attributor else _always
        with CountsPruner(self.probe, alive):
            self.pipeline.run(source or self.probe, stop, deadline)


@contextmanager
def _attribution(options: StackOptions) -> Iterator[Attributor | None]:
    if options.make_attributor is None:
        yield options.attributor
        return
    with options.make_attributor() as attributor:
        yield attributor


def _always(_cgroup_id: int) -> bool:
    return True
