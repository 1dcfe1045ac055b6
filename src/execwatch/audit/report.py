"""The migration-readiness report: a table for people, JSON and SARIF for pipelines.

Names from the cluster and the images (workloads, containers, references, paths, registry
replies) are escaped as `execwatch scan` escapes them (text.safe_name, safe_prose), and
reach the terminal as rich Text, never as markup.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from execwatch import __version__
from execwatch.audit.engine import AuditReport, ContainerResult
from execwatch.runnable.verdict import Outcome
from execwatch.text import safe_name, safe_prose, terminal_text

# The report's words for the outcomes (its JSON `status`, its table, its SARIF rule ids)
WORD = {
    Outcome.RUNS: "ready",
    Outcome.EMULATED: "emulated",
    Outcome.MISSING_PLATFORM: "missing-platform",
    Outcome.FAILS: "would-fail",
    Outcome.UNKNOWN: "error",
}

STYLE = {
    Outcome.RUNS: "green",
    Outcome.EMULATED: "cyan",
    Outcome.MISSING_PLATFORM: "yellow",
    Outcome.FAILS: "bold red",
    Outcome.UNKNOWN: "magenta",
}


def summary(c: ContainerResult) -> str:
    """One line, escaped."""
    v = c.verdict
    name = safe_name(c.container)
    if v.status is Outcome.RUNS:
        return "ready"
    if v.status is Outcome.MISSING_PLATFORM:
        return f"{name}: no {safe_name(v.platform)} in the image"
    if v.status is Outcome.UNKNOWN:
        return f"{name}: not checked ({safe_prose(v.message)})"
    if v.status is Outcome.EMULATED:
        return f"{name}: {_first(v.emulated, _emulated_as)}"
    return f"{name}: {_first(v.findings, lambda f: str(f['check']))}"


def _emulated_as(f: dict[str, Any]) -> str:
    return f"{WORD[Outcome.EMULATED]} ({f['arch']})"


def _first(findings: list[dict[str, Any]], what: Callable[[dict[str, Any]], str]) -> str:
    """The entrypoint's finding, else the first: its path, ★ for the entrypoint, `what` it
    is, and how many more there are."""
    first = next((f for f in findings if f["entrypoint"]), findings[0])
    star = " ★" if first["entrypoint"] else ""
    more = f" (+{len(findings) - 1})" if len(findings) > 1 else ""
    return f"{safe_name(first['path'])}{star} {safe_name(what(first))}{more}"


def _finding(f: dict[str, Any]) -> dict[str, Any]:
    out = {**f, "path": safe_name(f["path"]), "message": safe_prose(f["message"])}
    if "arch" in f:
        out["arch"] = safe_name(f["arch"])
    return out


def print_table(report: AuditReport, console: Console) -> None:
    archs = list(report.architectures)
    table = Table(title="Migration readiness", title_justify="left")
    table.add_column("workload")
    for arch in archs:
        emulates = (
            ", emulates " + ",".join(report.emulates[arch]) if arch in report.emulates else ""
        )
        table.add_column(terminal_text(f"{arch} ({report.architectures[arch]}{emulates})"))
    for w in report.workloads:
        cells = {a: Text("not scheduled here", "dim") for a in w.unschedulable}
        for a in w.archs:
            bad = [c for c in a.containers if c.verdict.status is not Outcome.RUNS]
            text = "; ".join(summary(c) for c in bad) if bad else "ready"
            cells[a.arch] = Text(text, STYLE[a.status])  # summary() escaped it
        table.add_row(terminal_text(w.workload.key), *(cells.get(a, "") for a in archs))
    console.print(table)
    counts = {s: 0 for s in Outcome}
    for w in report.workloads:
        for a in w.archs:
            counts[a.status] += 1
    console.print(
        Text(
            f"{len(report.workloads)} workloads; per workload and architecture: "
            + ", ".join(f"{counts[s]} {WORD[s]}" for s in Outcome)
            + f". Images scanned: {report.scanned}, from the cache: {report.from_cache}."
            + " ★ = the container's entrypoint."
        )
    )


def to_json(report: AuditReport) -> str:
    doc: dict[str, Any] = {
        "tool": f"execwatch audit {__version__}",
        "architectures": {safe_name(a): safe_prose(n) for a, n in report.architectures.items()},
        "emulates": {safe_name(a): [safe_name(e) for e in em] for a, em in report.emulates.items()},
        "scanned": report.scanned,
        "fromCache": report.from_cache,
        "workloads": [
            {
                "kind": safe_name(w.workload.kind),
                "namespace": safe_name(w.workload.namespace),
                "name": safe_name(w.workload.name),
                "notScheduledOn": [safe_name(a) for a in w.unschedulable],
                "architectures": {
                    safe_name(a.arch): {
                        "status": WORD[a.status],
                        "containers": [
                            {
                                "name": safe_name(c.container),
                                "init": c.init,
                                "image": safe_name(c.image),
                                "reference": safe_name(c.reference),
                                "digest": c.verdict.digest and safe_name(c.verdict.digest),
                                "platform": safe_name(c.verdict.platform),
                                "status": WORD[c.verdict.status],
                                "message": safe_prose(c.verdict.message),
                                "findings": [_finding(f) for f in c.verdict.findings],
                                "emulated": [_finding(f) for f in c.verdict.emulated],
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
    Outcome.EMULATED: "binaries of another architecture that these nodes run, slowly, through a"
    " binfmt_misc emulator (they fail where it is not registered)",
    Outcome.MISSING_PLATFORM: "the image index has no manifest for this node architecture",
    Outcome.FAILS: "a binary of the image would fail to start on this architecture",
    Outcome.UNKNOWN: "the image could not be checked",
}


LEVEL = {Outcome.EMULATED: "warning", Outcome.MISSING_PLATFORM: "warning"}


def to_sarif(report: AuditReport) -> str:
    results = []
    for w in report.workloads:
        for a in w.archs:
            for c in a.containers:
                v = c.verdict
                if v.status is Outcome.RUNS:
                    continue
                key = safe_name(w.workload.key)
                text = f"{key} on {safe_name(a.arch)}: {summary(c)}"
                if v.findings:
                    text += " — " + safe_prose(v.findings[0]["message"])
                elif v.status is Outcome.EMULATED:
                    text += " — " + RULES[Outcome.EMULATED]
                results.append(
                    {
                        "ruleId": f"audit/{WORD[v.status]}",
                        "level": LEVEL.get(v.status, "error"),
                        "message": {"text": text},
                        "locations": [
                            {"logicalLocations": [{"fullyQualifiedName": key, "kind": "resource"}]}
                        ],
                        "partialFingerprints": {
                            "workload/arch/container": safe_name(
                                f"{w.workload.key}/{a.arch}/{c.container}"
                            )
                        },
                    }
                )
    rules = [{"id": f"audit/{WORD[s]}", "shortDescription": {"text": t}} for s, t in RULES.items()]
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
