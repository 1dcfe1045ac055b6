"""The audit report with hostile names: the findings of a real scan of a root whose files
are named to hurt, a registry reply holding escapes, and markup in a workload's image. The
report is rendered directly (the audit itself needs a cluster: tests/audit/test_audit.py)."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from execwatch.audit.engine import (
    ArchResult,
    AuditReport,
    ContainerResult,
    Verdict,
    WorkloadResult,
)
from execwatch.audit.inventory import Container, Workload
from execwatch.audit.report import print_table, to_json, to_sarif
from execwatch.binfmt import Platform
from execwatch.runnable.verdict import Outcome
from execwatch.scan.model import Severity
from execwatch.scan.runner import ScanOptions, scan
from tests.scan.test_report_escaping import MARKUP, build_root, expected_paths, strict_json

SGR = re.compile(r"\x1b\[[0-9;]*m")
IMAGE = "registry.example/app:[bold]v1[/]\x1b[8m"
SHOWN_IMAGE = "registry.example/app:[bold]v1[/]\\x1b[8m"
REPLY = "registry.example: 401 \x1b]0;owned\x07[link=http://x]login[/link]"
SHOWN_REPLY = "registry.example: 401 \\x1b]0;owned\\x07[link=http://x]login[/link]"


def verdict_of(root: Path) -> Verdict:
    """A WOULD_FAIL verdict as the auditor makes it from a scan of `root`."""
    options = ScanOptions(platforms=(Platform.parse("linux/amd64"),))
    (result,) = scan(str(root), options).results
    findings = [
        {"check": str(f.check), "path": f.path, "severity": f.severity.label,
         "message": f.message, "entrypoint": f.entrypoint}
        for f in result.findings if f.severity >= Severity.ERROR
    ]  # fmt: skip
    return Verdict(Outcome.FAILS, result.platform, "sha256:" + "a" * 64, findings)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> AuditReport:
    failing = verdict_of(build_root(tmp_path_factory.mktemp("hostile")))
    broken = Verdict(Outcome.UNKNOWN, "linux/arm64", message=REPLY)
    workload = Workload("Deployment", "shop", "web", {}, [Container("main", IMAGE)])
    return AuditReport(
        {"amd64": "1 nodes", "arm64": "planned"},
        [
            WorkloadResult(
                workload,
                [
                    ArchResult("amd64", [ContainerResult("main", IMAGE, IMAGE, False, failing)]),
                    ArchResult("arm64", [ContainerResult("main", IMAGE, IMAGE, False, broken)]),
                ],
                [],
            )
        ],
        scanned=1,
    )


def test_the_table_in_a_terminal_shows_names_literally_and_no_control_but_its_styles(
    report: AuditReport,
) -> None:
    out = io.StringIO()
    print_table(report, Console(file=out, force_terminal=True, width=4000, color_system="standard"))
    raw = out.getvalue()
    assert SGR.search(raw), "rich wrote no style: not a terminal"
    text = SGR.sub("", raw)
    assert not {c for c in text if (ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) < 0xA0}
    assert "main: /bin/:thumbs_up: missing-shebang-interpreter (+13)" in text  # the first
    assert f"main: not checked ({SHOWN_REPLY})" in text
    assert "\x1b]8;" not in raw  # the [link] markup made no hyperlink


def test_the_table_shows_a_markup_path_literally(tmp_path: Path) -> None:
    root = build_root(tmp_path)
    findings = [f for f in verdict_of(root).findings if f["path"] == MARKUP]
    verdict = Verdict(Outcome.FAILS, "linux/amd64", None, findings)
    workload = Workload("Job", "shop", "[red]job[/]", {}, [Container("main", IMAGE)])
    arch = ArchResult("amd64", [ContainerResult("main", IMAGE, IMAGE, False, verdict)])
    out = io.StringIO()
    print_table(
        AuditReport({"amd64": "1 nodes"}, [WorkloadResult(workload, [arch], [])]),
        Console(file=out, width=4000),
    )
    assert f"main: {MARKUP} missing-shebang-interpreter" in out.getvalue()
    assert "Job/shop/[red]job[/]" in out.getvalue()


def test_json_is_strict_and_names_read_as_scan_shows_them(report: AuditReport) -> None:
    doc = strict_json(to_json(report).encode("utf-8"))
    (workload,) = doc["workloads"]
    (amd64,) = workload["architectures"]["amd64"]["containers"]
    assert {f["path"] for f in amd64["findings"]} == expected_paths()
    assert amd64["image"] == amd64["reference"] == SHOWN_IMAGE
    (arm64,) = workload["architectures"]["arm64"]["containers"]
    assert arm64["status"] == "error" and arm64["message"] == SHOWN_REPLY


def test_sarif_is_strict_json(report: AuditReport) -> None:
    doc: dict[str, Any] = strict_json(to_sarif(report).encode("utf-8"))
    texts = [r["message"]["text"] for r in doc["runs"][0]["results"]]
    assert len(texts) == 2
    assert any(SHOWN_REPLY in t for t in texts)
    assert json.dumps(doc).isascii()
