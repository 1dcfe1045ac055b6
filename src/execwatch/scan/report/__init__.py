"""Reporters: the same ScanReport as a table for people, JSON, SARIF 2.1.0 or JUnit XML."""

from __future__ import annotations

from collections.abc import Callable

from execwatch.scan.model import ScanReport
from execwatch.scan.report.json_report import render_json
from execwatch.scan.report.junit import render_junit
from execwatch.scan.report.sarif import render_sarif

TEXT_FORMATS: dict[str, Callable[[ScanReport], str]] = {
    "json": render_json,
    "sarif": render_sarif,
    "junit": render_junit,
}
FORMATS = ("table", *TEXT_FORMATS)
