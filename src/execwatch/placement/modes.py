"""Which namespaces placement serves: those labelled `execwatch.io/placement=enforce` or
`mitigate`, never a `kube-*` namespace nor execwatch's own.

Only the label a cluster administrator set on the namespace counts: a pod can give itself
the gate, never its namespace the label. The controller judges, and the handler's
feedback writes sightings, for those namespaces alone.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from execwatch.kube import errors
from execwatch.kube.client import Rest, path
from execwatch.placement.webhook import MODE_LABEL

ENFORCE, MITIGATE = "enforce", "mitigate"
PLACED = frozenset({ENFORCE, MITIGATE})


def never_placed(namespace: str, own: str) -> bool:
    """Namespaces placement never touches, whatever their label."""
    return namespace.startswith("kube-") or namespace == own


@dataclass
class NamespaceModes:
    """Each namespace's placement mode, read from the API server and believed for `ttl`
    seconds (at most `size` namespaces remembered)."""

    rest: Rest
    own_namespace: str
    ttl: float = 30.0
    size: int = 4096
    clock: Callable[[], float] = time.monotonic
    _known: dict[str, tuple[str, float]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def mode(self, namespace: str) -> str:
        """The namespace's mode, '' when it has none or is gone; an API error is raised."""
        with self._lock:
            known = self._known.get(namespace)
        if known is not None and self.clock() - known[1] < self.ttl:
            return known[0]
        try:
            ns = self.rest.call("GET", path("api", "v1", "namespaces", namespace))
        except errors.NotFoundError:
            ns = {}
        mode = str(((ns.get("metadata") or {}).get("labels") or {}).get(MODE_LABEL) or "")
        with self._lock:
            if len(self._known) >= self.size:
                self._known.clear()
            self._known[namespace] = (mode, self.clock())
        return mode

    def placed(self, namespace: str) -> bool:
        """Whether placement serves this namespace (enforce or mitigate)."""
        if never_placed(namespace, self.own_namespace):
            return False
        return self.mode(namespace) in PLACED
