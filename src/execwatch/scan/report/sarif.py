"""`--format sarif`: SARIF 2.1.0 for code-scanning upload; one rule per stable check id."""

from __future__ import annotations

import json
from typing import Any

from execwatch import __version__
from execwatch.scan.model import CHECK_DESCRIPTIONS, Check, ScanReport, Severity

SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.NOTE: "note"}


def render_sarif(report: ScanReport) -> str:
    rules = [
        {
            "id": str(check),
            "name": str(check).title().replace("-", ""),
            "shortDescription": {"text": CHECK_DESCRIPTIONS[check]},
            "helpUri": "https://github.com/execwatch/execwatch/blob/main/docs/scan.md",
        }
        for check in Check
    ]
    index = {str(check): i for i, check in enumerate(Check)}
    results: list[dict[str, Any]] = []
    for f in report.findings:
        uri = f.path.lstrip("/") or f.path
        results.append(
            {
                "ruleId": str(f.check),
                "ruleIndex": index[str(f.check)],
                "level": LEVEL[f.severity],
                "message": {"text": f"{f.message} [{f.platform}]"},
                "locations": [{"physicalLocation": {"artifactLocation": {"uri": uri}}}],
                "partialFingerprints": {"execwatch/v1": f"{f.check}:{f.platform}:{f.path}"},
                "properties": {"platform": f.platform, "entrypoint": f.entrypoint},
            }
        )
    doc = {
        "$schema": SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "execwatch",
                        "version": __version__,
                        "informationUri": "https://github.com/execwatch/execwatch",
                        "rules": rules,
                    }
                },
                "results": results,
            }
        ],
    }
    return json.dumps(doc, indent=2) + "\n"
