#!/usr/bin/env python3
"""Write deploy/grafana/execwatch.json, the Grafana dashboard (dev/gen-deploy.py runs it).

The dashboard is code here so that panels stay consistent (one datasource variable, one
namespace filter, the same interval everywhere); the JSON is what Grafana and the chart
ship. tests/deploy/test_dashboard.py checks every query against the metrics execwatch
really exports.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "deploy" / "grafana" / "execwatch.json"

DS = {"type": "prometheus", "uid": "${datasource}"}
NS = 'namespace=~"$namespace"'
# Failed execs: the handler's counter without the execs an emulator ran (they succeeded:
# the emulation row shows them).
FAIL = f'execwatch_exec_failures_total{{{NS}, reason!="Emulated"}}'


def in_range(counter: str) -> str:
    """What `counter` grew by in the dashboard's range, counting the series born in it: the
    handler's counters start at their first failure's count, which increase() never sees.
    Those series come first: `or` matches label sets without the metric name, so after
    increase() (which answers 0 for them) they would be left out."""
    return f"(({counter} unless {counter} offset $__range) or increase({counter}[$__range]))"


RI = "$__rate_interval"


class Layout:
    """Places panels on Grafana's 24-column grid, row by row."""

    def __init__(self) -> None:
        self.panels: list[dict[str, Any]] = []
        self.y = 0
        self.x = 0
        self.row_h = 0
        self.next_id = 1

    def row(self, title: str) -> None:
        self._newline()
        self.panels.append(
            {
                "type": "row",
                "title": title,
                "id": self._id(),
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y},
                "panels": [],
            }
        )
        self.y += 1

    def add(self, panel: dict[str, Any], w: int, h: int = 8) -> None:
        if self.x + w > 24:
            self._newline()
        panel["id"] = self._id()
        panel["gridPos"] = {"h": h, "w": w, "x": self.x, "y": self.y}
        panel["datasource"] = DS
        self.panels.append(panel)
        self.x += w
        self.row_h = max(self.row_h, h)

    def _newline(self) -> None:
        if self.x:
            self.y += self.row_h
        self.x, self.row_h = 0, 0

    def _id(self) -> int:
        self.next_id += 1
        return self.next_id - 1


def target(expr: str, legend: str = "", *, instant: bool = False, ref: str = "A") -> dict[str, Any]:
    t: dict[str, Any] = {"refId": ref, "datasource": DS, "expr": expr, "legendFormat": legend}
    if instant:
        t.update({"instant": True, "range": False, "format": "table"})
    return t


def timeseries(
    title: str, desc: str, *targets: dict[str, Any], unit: str = "short", stack: bool = True
) -> dict[str, Any]:
    return {
        "type": "timeseries",
        "title": title,
        "description": desc,
        "targets": list(targets),
        "fieldConfig": {
            "defaults": {
                "unit": unit,
                "custom": {
                    "drawStyle": "bars" if stack else "line",
                    "fillOpacity": 60 if stack else 10,
                    "stacking": {"mode": "normal" if stack else "none"},
                },
            },
            "overrides": [],
        },
        "options": {
            "legend": {
                "displayMode": "table",
                "placement": "right",
                "calcs": ["sum"] if stack else ["lastNotNull", "max"],
            },
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
    }


def stat(title: str, desc: str, expr: str, *, red_above: float | None = None) -> dict[str, Any]:
    steps: list[dict[str, Any]] = [{"color": "green", "value": None}]
    if red_above is not None:
        steps.append({"color": "red", "value": red_above})
    return {
        "type": "stat",
        "title": title,
        "description": desc,
        "targets": [target(expr, instant=False)],
        "fieldConfig": {
            "defaults": {"thresholds": {"mode": "absolute", "steps": steps}},
            "overrides": [],
        },
        "options": {"reduceOptions": {"calcs": ["lastNotNull"]}, "colorMode": "background"},
    }


EMULATED = f'execwatch_exec_failures_total{{{NS}, reason="Emulated"}}'


def emulation(g: Layout) -> None:
    """Foreign binaries that do not fail: a binfmt_misc emulator (user-mode QEMU) runs them,
    slowly. By node and architecture from the kernel's exact counts, by workload from the
    handler, and which nodes would emulate what (docs/metrics.md)."""
    g.row("Emulated execs (binfmt_misc: foreign binaries that run, slowly)")
    g.add(
        timeseries(
            "Emulated execs by node and architecture",
            "Successful execs the kernel handed to a binfmt_misc emulator, counted exactly "
            "in the kernel. Each is a binary of another architecture that fails with exec "
            "format error on nodes without the emulator.",
            target(
                f"sum by (node, emulated_arch) (rate(execwatch_kernel_emulated_execs_total[{RI}]))",
                "{{emulated_arch}} on {{node}}",
            ),
            unit="ops",
            stack=False,
        ),
        w=12,
    )
    g.add(
        table(
            "Nodes that emulate",
            "binfmt_misc emulators of each node, by architecture and flags (F: the "
            "interpreter works inside containers too).",
            "max by (node, emulated_arch, flags) (execwatch_node_binfmt_emulators)",
            {"emulated_arch": "emulated arch", "Value": "emulators"},
        ),
        w=12,
    )
    g.add(
        table(
            "Workloads running emulated binaries (range)",
            "Emulated execs in pods over the dashboard range (their Events, reason "
            "Emulated, name the binary and the emulator).",
            "topk(15, sum by (namespace, workload, container, binary_arch, node_arch, node)"
            f" {in_range(EMULATED)} > 0)",
            {"Value": "emulated execs", "binary_arch": "binary arch", "node_arch": "node arch"},
        ),
        w=24,
    )


def table(title: str, desc: str, expr: str, rename: dict[str, str]) -> dict[str, Any]:
    """An instant query as a table, sorted by value."""
    return {
        "type": "table",
        "title": title,
        "description": desc,
        "targets": [target(expr, instant=True)],
        "options": {"sortBy": [{"displayName": rename.get("Value", "Value"), "desc": True}]},
        "transformations": [
            {
                "id": "organize",
                "options": {"excludeByName": {"Time": True}, "renameByName": rename},
            }
        ],
        "fieldConfig": {"defaults": {}, "overrides": []},
    }


def dashboard() -> dict[str, Any]:
    g = Layout()
    g.row("Failed execs in pods (handler: execwatch_exec_failures_total)")
    g.add(
        stat(
            "Failed execs (range)",
            "Failed execs in pods over the dashboard range.",
            f"sum({in_range(FAIL)}) or vector(0)",
            red_above=1,
        ),
        w=4,
        h=4,
    )
    g.add(
        stat(
            "Workloads affected (range)",
            "Workloads with at least one failed exec.",
            f"count(sum by (namespace, workload) {in_range(FAIL)} > 0) or vector(0)",
            red_above=1,
        ),
        w=4,
        h=4,
    )
    g.add(
        stat(
            "Unattributed (range)",
            "Failed execs no pod explains (host or unknown).",
            f"sum({in_range('execwatch_handler_unattributed_total')}) or vector(0)",
        ),
        w=4,
        h=4,
    )
    g.add(
        stat(
            "Agents up",
            "Agents Prometheus can scrape / DaemonSet pods desired.",
            'sum(up{job="execwatch-agent"})',
        ),
        w=4,
        h=4,
    )
    g.add(
        stat(
            "Agents not ready",
            "DaemonSet pods desired but not ready (kube-state-metrics).",
            'sum(kube_daemonset_status_desired_number_scheduled{daemonset="execwatch-agent"}'
            ' - kube_daemonset_status_number_ready{daemonset="execwatch-agent"})',
            red_above=1,
        ),
        w=4,
        h=4,
    )
    g.add(
        stat(
            "Handler leader",
            "Handler replicas holding the Lease (should be 1).",
            'sum(execwatch_handler_leader{job="execwatch-handler"})',
        ),
        w=4,
        h=4,
    )
    g.add(
        timeseries(
            "Failed execs by reason",
            "Failed execs in pods, by diagnosis.",
            target(f"sum by (reason) (increase({FAIL}[{RI}]))", "{{reason}}"),
        ),
        w=12,
    )
    g.add(
        timeseries(
            "Failed execs by architecture",
            "Binary architecture against the node's (empty: not an ELF file).",
            target(
                f"sum by (binary_arch, node_arch) (increase({FAIL}[{RI}]))",
                "{{binary_arch}} binary on {{node_arch}} node",
            ),
        ),
        w=12,
    )
    g.add(
        timeseries(
            "Failed execs by namespace",
            "",
            target(f"sum by (namespace) (increase({FAIL}[{RI}]))", "{{namespace}}"),
        ),
        w=12,
    )
    g.add(
        timeseries(
            "Failed execs by node",
            "",
            target(f"sum by (node) (increase({FAIL}[{RI}]))", "{{node}}"),
        ),
        w=12,
    )
    top = {
        "type": "table",
        "title": "Top offending workloads (range)",
        "description": "Workloads with the most failed execs over the dashboard range.",
        "targets": [
            target(
                "topk(15, sum by (namespace, workload, container, reason, binary_arch, node_arch)"
                f" {in_range(FAIL)} > 0)",
                instant=True,
            )
        ],
        "options": {"sortBy": [{"displayName": "Value", "desc": True}]},
        "transformations": [
            {
                "id": "organize",
                "options": {
                    "excludeByName": {"Time": True},
                    "renameByName": {
                        "Value": "failed execs",
                        "binary_arch": "binary arch",
                        "node_arch": "node arch",
                    },
                },
            }
        ],
        "fieldConfig": {"defaults": {}, "overrides": []},
    }
    g.add(top, w=24, h=9)
    g.add(
        timeseries(
            "Unattributed failed execs by node",
            "Failures with no pod: host processes, or containers not named.",
            target(
                f"sum by (node, reason) (increase(execwatch_handler_unattributed_total[{RI}]))",
                "{{node}} {{reason}}",
            ),
        ),
        w=24,
    )

    g.row("Node agents")
    g.add(
        timeseries(
            "Kernel: failed execs by errno",
            "Every failed exec counted in the kernel, exact even when records drop.",
            target(
                f"sum by (errno) (rate(execwatch_kernel_exec_failures_total[{RI}]))", "{{errno}}"
            ),
            unit="ops",
            stack=False,
        ),
        w=12,
    )
    g.add(
        timeseries(
            "Diagnosed events by reason (all nodes)",
            "Failures delivered to user space and diagnosed, including host ones.",
            target(f"sum by (reason) (rate(execwatch_events_total[{RI}]))", "{{reason}}"),
            unit="ops",
            stack=False,
        ),
        w=12,
    )
    g.add(
        timeseries(
            "Early deaths in the kernel (all nodes)",
            "Processes that died within the window after a successful exec, counted "
            "exactly in the kernel: EXIT127/EXIT1 from inside the ELF loader, or a fatal "
            "signal. Their diagnoses (MissingLibrary, LibcMismatch, ...) are in the panels "
            "by reason.",
            target(
                f"sum by (status) (rate(execwatch_kernel_early_deaths_total[{RI}]))",
                "{{status}}",
            ),
            unit="ops",
            stack=False,
        ),
        w=12,
    )
    g.add(
        timeseries(
            "Drops",
            "Records lost: in the kernel (ring buffer full) and in the "
            "publisher (spool full, rejected). Should be zero.",
            target(
                f"sum by (node, type) (increase(execwatch_kernel_dropped_total[{RI}]))",
                "kernel {{type}} {{node}}",
            ),
            target(
                f"sum by (node, type) (increase(execwatch_publisher_dropped_total[{RI}]))",
                "publisher {{type}} {{node}}",
                ref="B",
            ),
        ),
        w=12,
    )
    g.add(
        timeseries(
            "Publisher",
            "Records created, failures folded into them, retries.",
            target(f"sum(rate(execwatch_publisher_published_total[{RI}]))", "records created"),
            target(
                f"sum(rate(execwatch_publisher_aggregated_total[{RI}]))",
                "failures aggregated",
                ref="B",
            ),
            target(
                f"sum(rate(execwatch_publisher_spooled_total[{RI}]))", "kept for retry", ref="C"
            ),
            target(
                f"sum by (code) (rate(execwatch_publisher_api_errors_total[{RI}]))",
                "API error {{code}}",
                ref="D",
            ),
            unit="ops",
            stack=False,
        ),
        w=12,
    )
    g.add(
        timeseries(
            "Spool by node",
            "Records waiting to be created on each node.",
            target("max by (node) (execwatch_publisher_spool_records)", "{{node}}"),
            stack=False,
        ),
        w=12,
    )
    g.add(
        timeseries(
            "Agents up by node",
            "1: scraped; 0: down.",
            target('max by (node) (up{job="execwatch-agent"})', "{{node}}"),
            stack=False,
        ),
        w=12,
    )

    emulation(g)

    g.row("Handler")
    g.add(
        timeseries(
            "Records by result",
            "handled, pod_missing, unattributed, invalid, duplicate.",
            target(f"sum by (result) (rate(execwatch_handler_records_total[{RI}]))", "{{result}}"),
            unit="ops",
            stack=False,
        ),
        w=8,
    )
    g.add(
        timeseries(
            "Latency: failure to Event",
            "From a record's lastSeen to its Event and label (p50, p99).",
            target(
                "histogram_quantile(0.5, sum by (le) (rate("
                f"execwatch_handler_latency_seconds_bucket[{RI}])))",
                "p50",
            ),
            target(
                "histogram_quantile(0.99, sum by (le) (rate("
                f"execwatch_handler_latency_seconds_bucket[{RI}])))",
                "p99",
                ref="B",
            ),
            unit="s",
            stack=False,
        ),
        w=8,
    )
    g.add(
        timeseries(
            "Invalid records, API errors, series overflow",
            "",
            target(
                f"sum by (type) (increase(execwatch_handler_invalid_records_total[{RI}]))",
                "invalid {{type}}",
            ),
            target(
                f"sum by (verb, code) (increase(execwatch_handler_api_errors_total[{RI}]))",
                "API {{verb}} {{code}}",
                ref="B",
            ),
            target(
                f"sum(increase(execwatch_handler_series_overflow_total[{RI}]))",
                "folded into _other",
                ref="C",
            ),
        ),
        w=8,
    )

    return {
        "title": "execwatch",
        "uid": "execwatch",
        "description": "Failed execs (exec format error, missing ELF loader, ...) in pods, "
        "and the health of the execwatch agents and handler.",
        "tags": ["execwatch", "multiarch"],
        "editable": True,
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "1m",
        "timezone": "",
        "graphTooltip": 1,
        "links": [],
        "annotations": {"list": []},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "type": "datasource",
                    "query": "prometheus",
                    "label": "Data source",
                    "current": {},
                    "hide": 0,
                },
                {
                    "name": "namespace",
                    "type": "query",
                    "label": "Namespace",
                    "datasource": DS,
                    "query": {
                        "query": "label_values(execwatch_exec_failures_total, namespace)",
                        "refId": "namespace",
                    },
                    "definition": "label_values(execwatch_exec_failures_total, namespace)",
                    "includeAll": True,
                    "multi": True,
                    "allValue": ".*",
                    "refresh": 2,
                    "current": {"text": "All", "value": "$__all"},
                    "hide": 0,
                    "sort": 1,
                },
            ]
        },
        "panels": g.panels,
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2, sort_keys=False) + "\n"


def main() -> int:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
