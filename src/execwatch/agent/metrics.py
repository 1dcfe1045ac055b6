"""Prometheus metrics of the agent's publisher: one prefix, `execwatch_publisher_`; what kind
of thing happened is a `type` label on one counter, as Tetragon does. Each component owns
its CollectorRegistry: nothing is registered at import time."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge


@dataclass
class PublisherMetrics:
    """What the agent's publisher did with the failures the probe gave it."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.failures = Counter(
            "execwatch_publisher_failures",
            "Failed execs handed to the publisher (after attribution).",
            registry=r,
        )
        self.published = Counter(
            "execwatch_publisher_published",
            "ExecFailure records created in the API server.",
            registry=r,
        )
        self.published_failures = Counter(
            "execwatch_publisher_published_failures",
            "Failed execs covered by the records created (sum of their counts).",
            registry=r,
        )
        self.aggregated = Counter(
            "execwatch_publisher_aggregated",
            "Failed execs folded into a pending record of the same container and path.",
            registry=r,
        )
        self.spooled = Counter(
            "execwatch_publisher_spooled",
            "Records kept for a retry because the API server did not take them.",
            registry=r,
        )
        self.spool_size = Gauge(
            "execwatch_publisher_spool_records",
            "Records waiting to be created (aggregating or awaiting a retry).",
            registry=r,
        )
        self.spool_bytes = Gauge(
            "execwatch_publisher_spool_bytes",
            "Bytes of the records waiting (their JSON bodies), against --spool-bytes.",
            registry=r,
        )
        self.replayed = Counter(
            "execwatch_publisher_replayed",
            "Records read back from the node's spool: after a restart, or adopted from an "
            "agent that is gone.",
            registry=r,
        )
        self.active = Gauge(
            "execwatch_publisher_active",
            "1 while this agent publishes for its node; 0 while another agent on the node "
            "does (the new pod of an upgrade's surge stands by until the old one hands over).",
            registry=r,
        )
        self.handed_over = Counter(
            "execwatch_publisher_handed_over",
            "Failed execs seen while another agent published for this node (an upgrade's "
            "surge) and left to it: not published twice.",
            registry=r,
        )
        self.spool_errors = Counter(
            "execwatch_publisher_spool_errors",
            "Failed writes or adoptions of the on-disk spool (records stay in memory).",
            registry=r,
        )
        self.dropped = Counter(
            "execwatch_publisher_dropped",
            "Failed execs lost, by type: spool_full (bound reached), rejected (the API "
            "refused the record for good), corrupt (a damaged spool entry; at least 1 each), "
            "standby_full (buffer of a standing-by agent full).",
            ["type"],
            registry=r,
        )
        self.unattributed = Counter(
            "execwatch_publisher_unattributed",
            "Failed execs with no pod (host processes, unknown cgroups); still published.",
            registry=r,
        )
        self.api_errors = Counter(
            "execwatch_publisher_api_errors",
            "Failed create calls, by HTTP status (0: no answer).",
            ["code"],
            registry=r,
        )
        for kind in ("spool_full", "rejected", "corrupt", "standby_full"):
            self.dropped.labels(kind)
