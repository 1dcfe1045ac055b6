"""Where the publisher's records go: created as ExecFailure custom resources."""

from __future__ import annotations

from typing import Any

from execwatch import crd
from execwatch.kube.client import Rest


class RecordApi:
    """`RecordSink` of the publisher: creates ExecFailure records. Failures are
    `kube.errors.ApiError` kinds."""

    def __init__(self, rest: Rest, namespace: str) -> None:
        self._rest = rest
        self._path = crd.records_path(namespace)

    def create(self, body: dict[str, Any]) -> None:
        self._rest.call("POST", self._path, body=body)
