"""`--format json`: one document; `findings` carries check, path, platform, severity, message."""

from __future__ import annotations

import json
from typing import Any

from execwatch import __version__
from execwatch.scan.model import Finding, ScanReport


def finding_dict(f: Finding, image: dict[str, str | None] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "check": str(f.check),
        "path": f.path,
        "platform": f.platform,
        "severity": f.severity.label,
        "message": f.message,
    }
    if f.entrypoint:
        out["entrypoint"] = True
    if image is not None:
        out["image"] = image
    return out


def render_json(report: ScanReport) -> str:
    doc = {
        "tool": {"name": "execwatch scan", "version": __version__},
        "target": report.target,
        "images": [
            {
                "source": r.source,
                "platform": r.platform,
                "digest": r.digest,
                "entrypoint": r.entrypoint,
                "notes": r.notes,
                "stats": {
                    "files": r.stats.files,
                    "executables": r.stats.executables,
                    "elf": r.stats.elf,
                    "scripts": r.stats.scripts,
                    "bytes_read": r.stats.bytes_read,
                    "seconds": round(r.stats.seconds, 3),
                },
            }
            for r in report.results
        ],
        "findings": [finding_dict(f, r.identity()) for r in report.results for f in r.findings],
        "warnings": report.warnings,
    }
    return json.dumps(doc, indent=2) + "\n"
