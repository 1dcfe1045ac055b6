"""Reporters: the same ScanReport as a table for people, JSON, SARIF 2.1.0 or JUnit XML.
Each format's module is imported only when that format is asked for (a JUnit report
brings in xml.etree: start-up that a JSON report does not pay)."""

from __future__ import annotations

from execwatch.scan.model import ScanReport

FORMATS = ("table", "json", "sarif", "junit")


def render(fmt: str, report: ScanReport) -> str:
    """`report` as text in `fmt`, one of FORMATS but table."""
    if fmt == "json":
        from execwatch.scan.report.json_report import render_json

        return render_json(report)
    if fmt == "sarif":
        from execwatch.scan.report.sarif import render_sarif

        return render_sarif(report)
    if fmt == "junit":
        from execwatch.scan.report.junit import render_junit

        return render_junit(report)
    raise ValueError(f"no text format {fmt!r}")
