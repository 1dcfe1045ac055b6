"""Placement reads Secrets and ServiceAccounts only in namespaces that opted in.

Its ServiceAccount holds no cluster-wide right on secrets. The first time a replica needs
the pull credentials of a namespace, it binds the ClusterRole `<name>-pull-credentials`
(`get` secrets and serviceaccounts) to itself there, with a RoleBinding of that name. The
chart's ValidatingAdmissionPolicy `<name>-pull-credentials` admits that binding only in a
namespace labelled `execwatch.io/placement` and only to this ServiceAccount, so a stolen
token cannot read a Secret of a namespace that did not opt in (docs/privileges.md). The
leader removes the binding from a namespace that no longer carries the label (`sweep`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cachetools import LRUCache

from execwatch.kube import errors
from execwatch.kube.client import Rest, path
from execwatch.placement.webhook import MODE_LABEL

log = logging.getLogger(__name__)

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "execwatch-placement"
MODES = ("enforce", "mitigate", "warn")
PROPAGATION = 2.0  # seconds a new binding may take to reach the API server's authorizer
SWEEP_EVERY = 300.0  # seconds between the leader's sweeps of opted-out namespaces


class NotOptedIn(Exception):
    """The namespace is not labelled execwatch.io/placement: nothing of it is read."""


@dataclass
class NamespaceAccess:
    """Binds `role` to (`account_namespace`, `account`) in each opted-in namespace."""

    rest: Rest
    role: str  # the ClusterRole and the RoleBinding's name
    account_namespace: str
    account: str
    max_known: int = 4096
    clock: Callable[[], float] = time.monotonic
    _known: LRUCache[str, float] = field(init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def __post_init__(self) -> None:
        self._known = LRUCache(self.max_known)

    def ensure(self, namespace: str) -> float:
        """Bind the role in `namespace` unless done already; the time from which reads
        there are authorized (a binding just made takes a moment to apply). NotOptedIn
        when the API server refuses the binding (the namespace did not opt in)."""
        with self._lock:
            since = self._known.get(namespace)  # an LRU hit: now the newest
            if since is not None:
                return since
        try:
            self.rest.call("POST", self._bindings(namespace), body=self._binding(namespace))
            since = self.clock() + PROPAGATION
        except errors.ConflictError:  # made before (by this or another replica)
            since = self.clock()
        except errors.PermanentError as err:
            if err.status in (403, 422):
                raise NotOptedIn(f"namespace {namespace} has not opted in") from None
            raise
        with self._lock:
            self._known[namespace] = since
        return since

    def forget(self, namespace: str) -> None:
        with self._lock:
            self._known.pop(namespace, None)

    def run(self, term: threading.Event) -> None:
        """The leader's task: sweep at once, then every SWEEP_EVERY while `term` is not set."""
        wait = 0.0
        while not term.wait(wait):
            try:
                self.sweep()
            except errors.ApiError as err:
                log.warning("pull-credentials sweep failed", extra={"kv": errors.as_dict(err)})
            wait = SWEEP_EVERY

    def sweep(self) -> int:
        """Delete the binding of every namespace that no longer opts in; how many."""
        listed = self.rest.call(
            "GET",
            path("apis", "rbac.authorization.k8s.io", "v1", "rolebindings"),
            query={"labelSelector": f"{MANAGED_BY}={MANAGER}"},
        )
        removed = 0
        for binding in listed.get("items") or []:
            namespace = str((binding.get("metadata") or {}).get("namespace") or "")
            if not namespace or self._opted_in(namespace):
                continue
            self.forget(namespace)
            try:
                self.rest.call("DELETE", self._bindings(namespace, self.role))
                removed += 1
            except errors.NotFoundError:
                pass
        return removed

    def _opted_in(self, namespace: str) -> bool:
        try:
            got = self.rest.call("GET", path("api", "v1", "namespaces", namespace))
        except errors.NotFoundError:
            return False
        labels = (got.get("metadata") or {}).get("labels") or {}
        return labels.get(MODE_LABEL) in MODES

    def _bindings(self, namespace: str, *name: str) -> str:
        return path("apis", "rbac.authorization.k8s.io", "v1", "namespaces", namespace,
                    "rolebindings", *name)  # fmt: skip

    def _binding(self, namespace: str) -> dict[str, Any]:
        return {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": self.role, "namespace": namespace,
                         "labels": {MANAGED_BY: MANAGER}},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": self.role},
            "subjects": [{"kind": "ServiceAccount", "name": self.account,
                          "namespace": self.account_namespace}],
        }  # fmt: skip
