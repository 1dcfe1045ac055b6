"""The handler lists records a page at a time; a page of the largest records an agent can
create must fit comfortably in the handler's 256 Mi pod (the chart's limit).

Decoded into Python objects, a JSON page takes about ten times its size; 500 records a
page (the old default) of the largest admitted records would be over 20 MB of JSON, and a
handler restarted with a full queue would crash-loop on the first list.
"""

from __future__ import annotations

from typing import Any

import yaml

from execwatch.handler.controller import HandlerConfig
from tests.support.deploy.chart import BASE

# The metadata the admission policy execwatch-agent-record-metadata lets through: a 63
# character name, one label, two managedFields entries of at most 2 x 24 x (32 + 6 x 40)
# characters of field names, plus the fields the API server sets.
METADATA_BYTES = 63 + 60 + 2 * (2 * 24 * (32 + 6 * 40) + 200) + 1024
PAGE_BUDGET = 4 * 2**20  # JSON bytes of one page: about 40 MiB once decoded


def largest_string(schema: dict[str, Any]) -> int:
    if "maxLength" in schema:
        return int(schema["maxLength"])
    return max((len(e) for e in schema.get("enum", [])), default=40)  # enums and date-times


def largest_spec(schema: dict[str, Any]) -> int:
    """JSON bytes of a spec with every string at its CRD bound (keys and quotes counted)."""
    size = largest_string(schema) + 2 if schema.get("type") == "string" else 20
    for key, sub in schema.get("properties", {}).items():
        size += len(key) + 4 + largest_spec(sub)
    return size


def test_a_page_of_the_largest_records_fits_the_handlers_memory() -> None:
    crd = next(d for d in yaml.safe_load_all((BASE / "crd.yaml").read_text()) if d)
    root = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    record = largest_spec(root["properties"]["spec"]) + METADATA_BYTES
    page = HandlerConfig(identity="handler-0").list_page
    assert 10_000 < record < 64 * 1024  # the CRD bounds every string
    assert page * record <= PAGE_BUDGET, (page, record)
    assert page >= 20  # still few round trips for a full queue (5,000 records: 100 lists)
