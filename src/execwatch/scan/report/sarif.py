"""`--format sarif`: SARIF 2.1.0 for code-scanning upload; one rule per stable check id.

Strings from the input are escaped as in every format (text.safe_name, safe_prose); a
location is the path's exact bytes as a percent-encoded relative URI (text.uri_path).
Fingerprints hash the raw path and message, so escaping never changes them.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from typing import Any

from execwatch import __version__
from execwatch.scan.model import Finding, ScanReport, Severity
from execwatch.scan.report.json_report import identity
from execwatch.scan.vocabulary import CHECK_DESCRIPTIONS, Check
from execwatch.text import safe_name, safe_prose, uri_path

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
    seen: Counter[str] = Counter()
    several = len(report.results) > 1
    for r in report.results:
        image = r.digest or r.source
        for f in r.findings:
            platform = f"[{safe_name(f.platform)}]"
            where = f"{safe_name(r.source)} {platform}" if several else platform
            results.append(
                {
                    "ruleId": str(f.check),
                    "ruleIndex": index[str(f.check)],
                    "level": LEVEL[f.severity],
                    "message": {"text": f"{safe_prose(f.message)} {where}"},
                    "locations": [
                        {"physicalLocation": {"artifactLocation": {"uri": uri_path(f.path)}}}
                    ],
                    "partialFingerprints": {"execwatch/v2": _fingerprint(f, image, seen)},
                    "properties": {
                        "platform": safe_name(f.platform),
                        "entrypoint": f.entrypoint,
                        "source": f.source,
                        "image": identity(r),
                    },
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


def _fingerprint(f: Finding, image: str, seen: Counter[str]) -> str:
    """Stable across runs (no line numbers to anchor on), unique within one report.

    The message is part of it: two missing libraries of one binary are two results. An
    exact repeat (same image, check, path and message) gets an occurrence number.
    """
    key = "\0".join((str(f.check), image, f.platform, f.path, f.message))
    digest = hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()[:32]
    seen[digest] += 1
    return digest if seen[digest] == 1 else f"{digest}:{seen[digest]}"
