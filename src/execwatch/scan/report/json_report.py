"""`--format json`: one document; `findings` carries check, path, platform, severity, message.

Strings from the input are escaped as everywhere else (text.safe_name, safe_prose): the
document is plain ASCII JSON for any file name, and a path's bytes can be read back from it.
"""

from __future__ import annotations

import json
from typing import Any

from execwatch import __version__
from execwatch.scan.model import Finding, ImageResult, ScanReport
from execwatch.text import safe_name, safe_prose


def finding_dict(f: Finding, image: dict[str, str | None] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "check": str(f.check),
        "path": safe_name(f.path),
        "platform": safe_name(f.platform),
        "severity": f.severity.label,
        "message": safe_prose(f.message),
    }
    if f.entrypoint:
        out["entrypoint"] = True
    out["source"] = f.source
    if f.disagreement:
        out["disagreement"] = safe_prose(f.disagreement)
    if image is not None:
        out["image"] = image
    return out


def identity(r: ImageResult) -> dict[str, str | None]:
    """ImageResult.identity, escaped."""
    return {k: None if v is None else safe_name(v) for k, v in r.identity().items()}


def render_json(report: ScanReport) -> str:
    doc = {
        "tool": {"name": "execwatch scan", "version": __version__},
        "target": safe_name(report.target),
        "images": [
            {
                **identity(r),
                "entrypoint": r.entrypoint and [safe_name(word) for word in r.entrypoint],
                "notes": [safe_prose(n) for n in r.notes],
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
        "findings": [finding_dict(f, identity(r)) for r in report.results for f in r.findings],
        "warnings": [safe_prose(w) for w in report.warnings],
    }
    return json.dumps(doc, indent=2) + "\n"
