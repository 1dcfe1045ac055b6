"""Prometheus metrics of the handler.

One prefix, `execwatch_`; what kind of thing happened is a `type` label on one counter
(`execwatch_publisher_dropped_total{type="spool_full"}`), as Tetragon does, so a
dashboard sums or splits them without knowing every name. Each component owns its own
CollectorRegistry: nothing is registered at import time, so two handlers (or an agent and
a handler) can live in one test process.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from execwatch.binfmt.platform import OCI_ARCHITECTURES
from execwatch.kube.safe import metric_label

EXEC_FAILURE_LABELS = (
    "namespace",
    "workload",
    "container",
    "node",
    "node_arch",
    "binary_arch",
    "reason",
)
UNATTRIBUTED_LABELS = ("node", "node_arch", "reason", "type")
# Labels whose values come from the workload or the node and can explode: the guard folds
# them into OVERFLOW. node_arch, binary_arch (known OCI names or "other") and reason (an
# enum) come from small fixed sets and are kept even when a series is folded.
_HIGH_CARDINALITY = ("namespace", "workload", "container", "node", "pod")
OVERFLOW = "_other"
OTHER_ARCH = "other"


def arch_label(value: str | None) -> str:
    """An architecture as a label: a known OCI name, "" when unknown, else "other"."""
    if not value:
        return ""
    return value if value in OCI_ARCHITECTURES else OTHER_ARCH


@dataclass
class SeriesGuard:
    """At most `limit` distinct label sets; past it, new sets have their high-cardinality
    labels replaced by OVERFLOW (the total stays right, memory stays bounded)."""

    names: tuple[str, ...]
    limit: int
    overflow: Counter
    _seen: set[tuple[str, ...]] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def admit(self, values: tuple[str, ...], amount: int) -> tuple[str, ...]:
        with self._lock:
            if values in self._seen:
                return values
            if len(self._seen) < self.limit:
                self._seen.add(values)
                return values
        self.overflow.inc(amount)
        return tuple(
            OVERFLOW if name in _HIGH_CARDINALITY else v
            for name, v in zip(self.names, values, strict=True)
        )


@dataclass
class HandlerMetrics:
    """What the handler turned records into."""

    max_series: int = 5000
    with_pod_label: bool = False
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        labels = EXEC_FAILURE_LABELS + (("pod",) if self.with_pod_label else ())
        self._labels = labels
        self.exec_failures = Counter(
            "execwatch_exec_failures",
            "Failed execs in pods, from handled ExecFailure records.",
            labels,
            registry=r,
        )
        self.unattributed = Counter(
            "execwatch_handler_unattributed",
            "Failed execs not attributed to a pod, by type: no_pod (the record names none: "
            "host or unknown cgroup), pod_missing (the pod it names does not exist with "
            "that UID, so its namespace and workload are not believed).",
            UNATTRIBUTED_LABELS,
            registry=r,
        )
        self.invalid = Counter(
            "execwatch_handler_invalid_records",
            "Records not acted on, by type (malformed, oversized, node_mismatch, pod_forbidden).",
            ["type"],
            registry=r,
        )
        self.records = Counter(
            "execwatch_handler_records",
            "Records taken off the queue, by result (handled, pod_missing, unattributed, "
            "invalid, duplicate).",
            ["result"],
            registry=r,
        )
        self.series_overflow = Counter(
            "execwatch_handler_series_overflow",
            "Increments folded into _other series because a series cap was reached.",
            registry=r,
        )
        self.api_errors = Counter(
            "execwatch_handler_api_errors",
            "Failed API calls, by verb and HTTP status (0: no answer).",
            ["verb", "code"],
            registry=r,
        )
        self.leader = Gauge(
            "execwatch_handler_leader",
            "1 while this replica holds the Lease.",
            registry=r,
        )
        self.latency = Histogram(
            "execwatch_handler_latency_seconds",
            "From a record's lastSeen to its Event and label being written.",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300),
            registry=r,
        )
        self._failures_guard = SeriesGuard(labels, self.max_series, self.series_overflow)
        self._unattributed_guard = SeriesGuard(
            UNATTRIBUTED_LABELS, self.max_series, self.series_overflow
        )

    def count_failures(self, labels: dict[str, str | None], amount: int) -> None:
        """Add `amount` to the exec failure counter, behind the cardinality guard.

        Past `max_series` distinct label sets, new ones are folded into a series whose
        namespace/workload/container/node(/pod) are `_other`: the total stays right, the
        reason and architectures stay visible, and Prometheus memory stays bounded.
        """
        values = tuple(_value(name, labels.get(name)) for name in self._labels)
        values = self._failures_guard.admit(values, amount)
        self.exec_failures.labels(*values).inc(amount)

    def count_unattributed(
        self, node: str, node_arch: str, reason: str, kind: str, amount: int
    ) -> None:
        labels = {"node": node, "node_arch": node_arch, "reason": reason, "type": kind}
        values = tuple(_value(name, labels[name]) for name in UNATTRIBUTED_LABELS)
        values = self._unattributed_guard.admit(values, amount)
        self.unattributed.labels(*values).inc(amount)


def _value(name: str, value: str | None) -> str:
    if name in ("node_arch", "binary_arch"):
        return arch_label(value)
    return metric_label(value)
