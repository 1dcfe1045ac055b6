"""Keep the webhook's certificate Secret and the configuration's caBundle in step.

The leader runs `CertRotator.sync()` at start and periodically: it renews the Secret when
`certs.renewal` says so (optimistic concurrency on the Secret's resourceVersion, so two
replicas never write different certificates) and sets every webhook's `caBundle` of the
configurations (the mutating `/gate` and the validating `/warn`, one name) to the
Secret's CA. Every replica serves the files of the mounted Secret
and reloads them when they change (`CertFiles`).
"""

from __future__ import annotations

import base64
import datetime as dt
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from execwatch.kube import errors
from execwatch.kube.client import Rest, path
from execwatch.serving.certs import Bundle, renewal

KEYS = ("ca.crt", "ca.key", "tls.crt", "tls.key")  # cert-manager's layout, plus the CA key
JSON_PATCH = "application/json-patch+json"
# The two kinds of configuration placement registers under one name.
CONFIGURATIONS = ("mutatingwebhookconfigurations", "validatingwebhookconfigurations")


def configuration_path(kind: str, name: str) -> str:
    return path("apis", "admissionregistration.k8s.io", "v1", kind, name)


@dataclass
class CertRotator:
    rest: Rest
    namespace: str
    secret: str
    configuration: str  # the webhook configurations' name (both kinds), whose caBundle we own
    names: list[str]
    now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)

    def sync(self) -> bool:
        """Renew what needs it and set the caBundle; True when anything was written."""
        current, version = self._read()
        fresh = renewal(current, self.names, self.now())
        if fresh is not None:
            self._write(fresh, version)
        bundle = fresh or current
        assert bundle is not None
        written = [self._set_ca_bundle(kind, bundle.ca_cert) for kind in CONFIGURATIONS]
        return any(written) or fresh is not None

    def _secret_path(self, name: str | None = None) -> str:
        parts = ("api", "v1", "namespaces", self.namespace, "secrets")
        return path(*parts, *((name,) if name else ()))

    def _read(self) -> tuple[Bundle | None, str | None]:
        try:
            obj = self.rest.call("GET", self._secret_path(self.secret))
        except errors.NotFoundError:
            return None, None
        version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
        data = obj.get("data") or {}
        try:
            values = [base64.b64decode(data[k], validate=True) for k in KEYS]
        except (KeyError, ValueError, TypeError):
            return None, version
        ca_cert, ca_key, cert, key = values
        return Bundle(ca_cert, ca_key, cert, key), version

    def _write(self, bundle: Bundle, version: str | None) -> None:
        values = (bundle.ca_cert, bundle.ca_key, bundle.cert, bundle.key)
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/tls",
            "metadata": {"name": self.secret, "namespace": self.namespace},
            "data": {k: base64.b64encode(v).decode() for k, v in zip(KEYS, values, strict=True)},
        }
        if version is None:
            self.rest.call("POST", self._secret_path(), body=body)
        else:
            body["metadata"]["resourceVersion"] = version  # a 409 if another wrote first
            self.rest.call("PUT", self._secret_path(self.secret), body=body)

    def _set_ca_bundle(self, kind: str, ca: bytes) -> bool:
        where = configuration_path(kind, self.configuration)
        try:
            config = self.rest.call("GET", where)
        except errors.NotFoundError:
            if kind == CONFIGURATIONS[0]:
                raise
            return False  # no warn webhook registered (an older manifest): nothing to set
        wanted = base64.b64encode(ca).decode()
        ops: list[dict[str, Any]] = []
        for i, hook in enumerate(config.get("webhooks") or []):
            if (hook.get("clientConfig") or {}).get("caBundle") != wanted:
                ops.append({"op": "test", "path": f"/webhooks/{i}/name", "value": hook["name"]})
                ops.append(
                    {"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": wanted}
                )
        if ops:
            self.rest.call("PATCH", where, body=ops, content_type=JSON_PATCH)
        return bool(ops)


@dataclass
class CertFiles:
    """The mounted Secret's serving files; `changed()` is True once after they change."""

    cert: str
    key: str
    _seen: tuple[float, float] | None = field(default=None, init=False)

    def ready(self) -> bool:
        return os.path.exists(self.cert) and os.path.exists(self.key)

    def changed(self) -> bool:
        try:
            stamp = (os.stat(self.cert).st_mtime, os.stat(self.key).st_mtime)
        except FileNotFoundError:
            return False
        if stamp == self._seen:
            return False
        self._seen = stamp
        return True
