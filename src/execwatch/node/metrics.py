"""Prometheus metrics of the node side (trace and agent).

Kernel counts are read from the BPF maps at scrape time, so they are exact even when
the ring buffer overflowed; user-space counters say what was delivered and diagnosed.
Everything lives in one registry object: nothing global.
"""

from __future__ import annotations

import errno as errno_mod
from collections.abc import Iterable, Iterator, Mapping
from typing import Protocol, runtime_checkable

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from execwatch.binfmt.emulation import Emulator
from execwatch.record import Reason, UndiagnosedCause


class KernelCounters(Protocol):
    def errno_totals(self) -> dict[int, int]: ...
    def death_totals(self) -> dict[str, int]: ...
    def stats(self) -> dict[str, int]: ...
    def shed_top(self) -> tuple[Mapping[str, str], int] | None: ...


@runtime_checkable
class EmulatorInventory(Protocol):
    """A probe that watches the node's binfmt_misc emulators (probe.loader.Probe)."""

    def binfmt_emulators(self) -> tuple[Emulator, ...]: ...
    def emulated_totals(self) -> dict[str, int]: ...


def errno_name(err: int) -> str:
    return errno_mod.errorcode.get(err, str(err))


class KernelCollector(Collector):
    def __init__(self, probe: KernelCounters) -> None:
        self._probe = probe

    def collect(self) -> Iterable[Metric]:
        failures = CounterMetricFamily(
            "execwatch_kernel_exec_failures",
            "Failed execve/execveat calls counted in the kernel (exact, every errno).",
            labels=["errno"],
        )
        for err, n in sorted(self._probe.errno_totals().items()):
            failures.add_metric([errno_name(err)], n)
        drops = CounterMetricFamily(
            "execwatch_kernel_dropped",
            "Events the kernel could not hand to user space, by type (counts stay exact).",
            labels=["type"],
        )
        for kind, n in self._probe.stats().items():
            drops.add_metric([kind], n)
        deaths = CounterMetricFamily(
            "execwatch_kernel_early_deaths",
            "Processes that died within the window after their exec, counted in the kernel"
            " (exact): a fatal signal (SIGSEGV) or an exit from the ELF loader (EXIT127).",
            labels=["status"],
        )
        for status, n in sorted(self._probe.death_totals().items()):
            deaths.add_metric([status], n)
        top = GaugeMetricFamily(
            "execwatch_kernel_cgroup_budget_top",
            "Records the kernel withheld from the living cgroup that lost the most to its "
            "ring-buffer budget (one series at most: the total is "
            'execwatch_kernel_dropped_total{type="cgroup_budget"}).',
            labels=["cgroup"],
        )
        shed = self._probe.shed_top()
        if shed is not None:
            top.add_metric([shed[0]["cgroup"]], shed[1])
        yield failures
        yield drops
        yield deaths
        yield top
        if isinstance(self._probe, EmulatorInventory):
            yield from emulation_metrics(self._probe)

    def describe(self) -> Iterator[Metric]:
        return iter(())


def emulation_metrics(probe: EmulatorInventory) -> Iterator[Metric]:
    emulators = GaugeMetricFamily(
        "execwatch_node_binfmt_emulators",
        "Enabled binfmt_misc entries that run another architecture's ELF binaries here "
        "through an emulator (user-mode QEMU): such binaries start, slowly, instead of failing.",
        labels=["emulated_arch", "flags"],
    )
    found: dict[tuple[str, str], int] = {}
    for emu in probe.binfmt_emulators():
        found[(emu.arch, emu.flags)] = found.get((emu.arch, emu.flags), 0) + 1
    for labels, n in sorted(found.items()):
        emulators.add_metric(list(labels), n)
    execs = CounterMetricFamily(
        "execwatch_kernel_emulated_execs",
        "Successful execs handed to a binfmt_misc emulator, counted in the kernel (exact), "
        "by emulated architecture.",
        labels=["emulated_arch"],
    )
    for arch, n in sorted(probe.emulated_totals().items()):
        execs.add_metric([arch], n)
    yield emulators
    yield execs


class NodeMetrics:
    """The pipeline's observer: counts delivered events by errno and diagnosis."""

    def __init__(self, registry: CollectorRegistry, probe: KernelCounters | None = None) -> None:
        self.registry = registry
        self.events = Counter(
            "execwatch_events",
            "Failed execs delivered to user space, by errno and diagnosed reason.",
            ["errno", "reason"],
            registry=registry,
        )
        self.aggregated_events = Counter(
            "execwatch_events_aggregated",
            "Delivered failures folded into an earlier identical record instead of printed again.",
            registry=registry,
        )
        self.dropped_events = Counter(
            "execwatch_pipeline_dropped",
            "Failed execs user space could not diagnose because it was overloaded, by type "
            "(they are still reported, as Undiagnosed).",
            ["type"],
            registry=registry,
        )
        self.undiagnosed = Counter(
            "execwatch_undiagnosed",
            "Failures reported Undiagnosed, by cause (slow_mount, overran, killed, gone, ...: "
            "docs/metrics.md). Every cause is exported from the start, at 0.",
            ["cause"],
            registry=registry,
        )
        for cause in UndiagnosedCause:
            self.undiagnosed.labels(str(cause))
        self.overruns = Counter(
            "execwatch_pipeline_overruns",
            "Diagnosis or attribution calls that overran their time budget (a slow or hung "
            "file system), by stage.",
            ["stage"],
            registry=registry,
        )
        self._kernel = KernelCollector(probe) if probe is not None else None
        if self._kernel is not None:
            registry.register(self._kernel)

    def detach_kernel(self) -> None:
        """Stop reading the probe's maps (call before the probe is closed): the registry
        keeps the user-space counters, which may still be read."""
        if self._kernel is not None:
            self.registry.unregister(self._kernel)
            self._kernel = None

    def delivered(
        self,
        errno: int | str,
        reason: Reason,
        *,
        aggregated: bool,
        count: int = 1,
        cause: UndiagnosedCause | None = None,
    ) -> None:
        name = errno if isinstance(errno, str) else errno_name(errno)
        self.events.labels(name, str(reason)).inc(count)
        if reason is Reason.UNDIAGNOSED:
            self.undiagnosed.labels(str(cause or UndiagnosedCause.UNEXPLAINED)).inc(count)
        if aggregated:
            self.aggregated_events.inc(count)

    def dropped(self, kind: str, count: int = 1) -> None:
        self.dropped_events.labels(kind).inc(count)

    def overran(self, stage: str) -> None:
        self.overruns.labels(stage).inc()


def undiagnosed_summary(registry: CollectorRegistry) -> str:
    """One line: how many failures were delivered, and the Undiagnosed ones by cause."""
    total = sum(
        sample.value
        for metric in registry.collect()
        if metric.name == "execwatch_events"
        for sample in metric.samples
        if sample.name == "execwatch_events_total"
    )
    causes = {
        str(cause): registry.get_sample_value("execwatch_undiagnosed_total", {"cause": str(cause)})
        or 0.0
        for cause in UndiagnosedCause
    }
    undiagnosed = sum(causes.values())
    line = f"{total:.0f} failures seen, {undiagnosed:.0f} undiagnosed"
    found = ", ".join(f"{n:.0f} {cause}" for cause, n in causes.items() if n)
    return f"{line} ({found})" if found else line
