"""The migration-readiness report: a table for people, JSON and SARIF for pipelines."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.table import Table

from execwatch import __version__
from execwatch.audit.engine import AuditReport, ContainerVerdict, Status

STYLE = {
    Status.READY: "green",
    Status.MISSING_PLATFORM: "yellow",
    Status.WOULD_FAIL: "bold red",
    Status.ERROR: "magenta",
}


def summary(c: ContainerVerdict) -> str:
    v = c.verdict
    if v.status is Status.READY:
        return "ready"
    if v.status is Status.MISSING_PLATFORM:
        return f"{c.container}: no {v.platform} in the image"
    if v.status is Status.ERROR:
        return f"{c.container}: not checked ({v.message})"
    first = v.findings[0]
    star = " ★" if first["entrypoint"] else ""
    more = f" (+{len(v.findings) - 1})" if len(v.findings) > 1 else ""
    return f"{c.container}: {first['path']}{star} {first['check']}{more}"


def print_table(report: AuditReport, console: Console) -> None:
    archs = list(report.architectures)
    table = Table(title="Migration readiness", title_justify="left")
    table.add_column("workload")
    for arch in archs:
        table.add_column(f"{arch} ({report.architectures[arch]})")
    for w in report.workloads:
        cells = {a: "[dim]not scheduled here[/dim]" for a in w.unschedulable}
        for a in w.archs:
            bad = [c for c in a.containers if c.verdict.status is not Status.READY]
            text = "; ".join(summary(c) for c in bad) if bad else "ready"
            cells[a.arch] = f"[{STYLE[a.status]}]{text}[/]"
        table.add_row(w.workload.key, *(cells.get(a, "") for a in archs))
    console.print(table)
    counts = {s: 0 for s in Status}
    for w in report.workloads:
        for a in w.archs:
            counts[a.status] += 1
    console.print(
        f"{len(report.workloads)} workloads; per workload and architecture: "
        + ", ".join(f"{counts[s]} {s.label}" for s in Status)
        + f". Images scanned: {report.scanned}, from the cache: {report.from_cache}."
        + " ★ = the container's entrypoint.",
        highlight=False,
    )


def to_json(report: AuditReport) -> str:
    doc: dict[str, Any] = {
        "tool": f"execwatch audit {__version__}",
        "architectures": report.architectures,
        "scanned": report.scanned,
        "fromCache": report.from_cache,
        "workloads": [
            {
                "kind": w.workload.kind,
                "namespace": w.workload.namespace,
                "name": w.workload.name,
                "notScheduledOn": w.unschedulable,
                "architectures": {
                    a.arch: {
                        "status": a.status.label,
                        "containers": [
                            {
                                "name": c.container,
                                "init": c.init,
                                "image": c.image,
                                "reference": c.reference,
                                "digest": c.verdict.digest,
                                "platform": c.verdict.platform,
                                "status": c.verdict.status.label,
                                "message": c.verdict.message,
                                "findings": c.verdict.findings,
                            }
                            for c in a.containers
                        ],
                    }
                    for a in w.archs
                },
            }
            for w in report.workloads
        ],
    }
    return json.dumps(doc, indent=2) + "\n"


RULES = {
    Status.MISSING_PLATFORM: "the image index has no manifest for this node architecture",
    Status.WOULD_FAIL: "a binary of the image would fail to start on this architecture",
    Status.ERROR: "the image could not be checked",
}


def to_sarif(report: AuditReport) -> str:
    results = []
    for w in report.workloads:
        for a in w.archs:
            for c in a.containers:
                v = c.verdict
                if v.status is Status.READY:
                    continue
                text = f"{w.workload.key} on {a.arch}: {summary(c)}"
                if v.findings:
                    text += " — " + v.findings[0]["message"]
                results.append(
                    {
                        "ruleId": f"audit/{v.status.label}",
                        "level": "warning" if v.status is Status.MISSING_PLATFORM else "error",
                        "message": {"text": text},
                        "locations": [
                            {
                                "logicalLocations": [
                                    {"fullyQualifiedName": w.workload.key, "kind": "resource"}
                                ]
                            }
                        ],
                        "partialFingerprints": {
                            "workload/arch/container": f"{w.workload.key}/{a.arch}/{c.container}"
                        },
                    }
                )
    rules = [{"id": f"audit/{s.label}", "shortDescription": {"text": t}} for s, t in RULES.items()]
    doc = {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [
            {
                "tool": {"driver": {"name": "execwatch audit", "version": __version__,
                                    "rules": rules}},
                "results": results,
            }
        ],
    }  # fmt: skip
    return json.dumps(doc, indent=2) + "\n"
