"""Where the publisher's records go: created as ExecFailure custom resources."""

from __future__ import annotations

import functools
from typing import Any

from execwatch import crd
from execwatch.kube.kubeapi import translate


@functools.cache
def record_resource() -> Any:
    from lightkube.generic_resource import create_namespaced_resource

    return create_namespaced_resource(crd.GROUP, crd.VERSION, crd.KIND, crd.PLURAL)


class RecordApi:
    """`RecordSink` of the publisher: creates ExecFailure records."""

    def __init__(self, api: Any, namespace: str) -> None:
        self._api = api
        self._namespace = namespace

    def create(self, body: dict[str, Any]) -> None:
        with translate():
            self._api.create(record_resource()(body), namespace=self._namespace)
