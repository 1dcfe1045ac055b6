"""The registry credentials a pod may pull with: its `imagePullSecrets`, then its
ServiceAccount's, as the kubelet would use them, and nothing else: a credentials file of
the controller's own (Docker's, Podman's, a netrc file) stops it from judging at all.
With `access` (the controller's), they are read only in a namespace that opted in
(access.py): a pod of any other is not judged.

Only the secrets' `auths` are kept: a `credsStore` or `credHelpers` in a user's secret
would make the controller run a program of the user's choosing. A secret that is named but
absent is skipped, as the kubelet skips it.
"""

from __future__ import annotations

import base64
import json
import os
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from execwatch.kube import errors
from execwatch.kube.client import Rest, path
from execwatch.placement.access import NamespaceAccess, NotOptedIn
from execwatch.placement.controller import VerdictUnavailable
from execwatch.scan.registry import credential_files

DOCKERCONFIGJSON = ".dockerconfigjson"
DOCKERCFG = ".dockercfg"


def netrc_files() -> list[str]:
    """Where `requests` finds credentials for a request that carries none (`NETRC`, then
    `~/.netrc` and `~/_netrc`): a registry that asks for basic auth would get them."""
    home = os.path.expanduser("~")
    named = [os.environ["NETRC"]] if os.environ.get("NETRC") else []
    return [*named, os.path.join(home, ".netrc"), os.path.join(home, "_netrc")]


@dataclass(frozen=True)
class PullSecrets:
    rest: Rest
    access: NamespaceAccess | None = None

    @contextmanager
    def files(self, pod: Mapping[str, Any]) -> Iterator[list[str]]:
        """Credential files, one per secret in the kubelet's order, that exist only for the
        duration of the block; raises VerdictUnavailable when a credential of the
        controller's own would be consulted as well."""
        others = [f for f in [*credential_files([]), *netrc_files()] if os.path.exists(f)]
        if others:
            raise VerdictUnavailable(f"the controller has credentials of its own ({others[0]})")
        docs = self.configs(pod)
        with tempfile.TemporaryDirectory(prefix="execwatch-pull-") as d:
            written = []
            for i, doc in enumerate(docs):
                name = os.path.join(d, f"{i}.json")
                fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    json.dump(doc, f)
                written.append(name)
            yield written

    def configs(self, pod: Mapping[str, Any]) -> list[dict[str, Any]]:
        namespace = str((pod.get("metadata") or {}).get("namespace") or "")
        since = self._authorized_from(namespace)
        try:
            return self._read(namespace, pod.get("spec") or {}, since)
        except VerdictUnavailable:
            if self.access is not None:  # the binding may be gone (swept): make it again
                self.access.forget(namespace)
            raise

    def _read(self, namespace: str, spec: Mapping[str, Any], since: float) -> list[dict[str, Any]]:
        names = _names(spec.get("imagePullSecrets"))
        account = str(spec.get("serviceAccountName") or "default")
        where = path("api", "v1", "namespaces", namespace, "serviceaccounts", account)
        sa = self._get(where, since)
        names += [n for n in _names((sa or {}).get("imagePullSecrets")) if n not in names]
        docs = []
        for name in names:
            secret = self._get(path("api", "v1", "namespaces", namespace, "secrets", name), since)
            doc = _auths(secret) if secret is not None else None
            if doc is not None:
                docs.append(doc)
        return docs

    def _authorized_from(self, namespace: str) -> float:
        """When reads in `namespace` are authorized (0: always)."""
        if self.access is None:
            return 0.0
        try:
            return self.access.ensure(namespace)
        except NotOptedIn as exc:
            raise VerdictUnavailable(str(exc)) from None
        except errors.ApiError as err:
            raise VerdictUnavailable(f"pull secrets not readable: {err}") from None

    def _get(self, url: str, since: float) -> dict[str, Any] | None:
        """The object, None when absent; a 403 is tried again until `since` (a binding
        the API server's authorizer has not seen yet)."""
        while True:
            try:
                got: dict[str, Any] = self.rest.call("GET", url)
            except errors.NotFoundError:
                return None
            except errors.ApiError as err:
                if err.status == 403 and time.monotonic() < since:
                    time.sleep(0.05)
                    continue
                raise VerdictUnavailable(f"pull secrets not readable: {err}") from None
            return got


def _names(refs: object) -> list[str]:
    names: list[str] = []
    for ref in refs if isinstance(refs, list) else []:
        name = ref.get("name") if isinstance(ref, Mapping) else None
        if isinstance(name, str) and name and name not in names:
            names.append(name)
    return names


def _auths(secret: Mapping[str, Any]) -> dict[str, Any] | None:
    """A containers auth file holding only the secret's `auths`."""
    data = secret.get("data") or {}
    try:
        if DOCKERCONFIGJSON in data:
            auths = json.loads(base64.b64decode(data[DOCKERCONFIGJSON])).get("auths")
        elif DOCKERCFG in data:
            auths = json.loads(base64.b64decode(data[DOCKERCFG]))
        else:
            return None
    except (ValueError, TypeError, AttributeError):
        return None
    if not isinstance(auths, dict):
        return None
    return {"auths": {k: v for k, v in auths.items() if isinstance(v, dict)}}
