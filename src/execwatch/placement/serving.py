"""The webhook's HTTPS endpoint: execwatch's bounded server (serving/http.py) behind TLS.

The API server calls the webhook with a timeout of a few seconds and `failurePolicy:
Ignore`, so a slow answer only costs the gate; what any pod that reaches the port can
hold of the process is bounded as for the metrics port: connections, handshake and
request deadlines, a 3 MiB body (the API server's own object limit).

With `client_ca` (`--webhook-client-ca`) the handshake requires a client certificate
issued by that CA: the one the API server presents to webhooks when its
AdmissionConfiguration gives it one (`kubeConfigFile`, docs/placement.md). Anything else
that reaches the port is refused before a byte of HTTP is read.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter

from execwatch.serving.http import BoundedServer, Request, ServerLimits, response

log = logging.getLogger(__name__)

Handler = Callable[[str, bytes], tuple[int, bytes]]  # (path, body) -> (status, JSON body)
LIMITS = ServerLimits(max_connections=64, read_timeout=5.0, write_timeout=5.0, max_body=3 << 20)
_STATUS = {200: "200 OK", 400: "400 Bad Request", 404: "404 Not Found"}


def webhook_drops(registry: CollectorRegistry) -> Counter:
    return Counter(
        "execwatch_placement_webhook_connections_dropped",
        "Connections to the placement webhook closed without an answer, by type "
        "(over the connection cap, timed out, request too large).",
        ["type"],
        registry=registry,
    )


@dataclass
class WebhookServer:
    """Serves `handler` over TLS with the certificate at `cert`/`key` (reloadable). The
    port is bound at start even before the files hold a certificate (the Secret is filled
    by the leader): handshakes fail until `reload()` succeeds, and `serving` says so."""

    address: tuple[str, int]
    handler: Handler
    cert: str
    key: str
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    limits: ServerLimits = LIMITS
    client_ca: str | None = None  # PEM: callers must present a certificate it issued
    serving: bool = False

    def start(self) -> None:
        self._tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._tls.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.client_ca is not None:  # an unreadable CA fails here, before serving
            self._tls.load_verify_locations(cafile=self.client_ca)
            self._tls.verify_mode = ssl.CERT_REQUIRED
        dropped = webhook_drops(self.registry)
        self._server = BoundedServer(
            self.address, self._answer, self.limits, dropped, self._tls, "webhook"
        )  # bound here: a bad address fails before anything is logged
        try:
            self.reload()
        except (OSError, ssl.SSLError) as exc:
            log.info("no webhook certificate yet", extra={"kv": {"error": str(exc)[:200]}})
        self._server.start()

    def _answer(self, request: Request) -> bytes:
        if request.method != "POST":
            return response("405 Method Not Allowed", "text/plain", b"POST\n", request.method)
        status, body = self.handler(request.path, request.body)
        return response(_STATUS.get(status, f"{status} Error"), "application/json", body)

    def reload(self) -> None:
        """Take up a rotated certificate: new handshakes use it, open ones keep theirs."""
        self._tls.load_cert_chain(self.cert, self.key)
        self.serving = True

    @property
    def port(self) -> int:
        return self._server.server_port

    def stop(self) -> None:
        self._server.shutdown()
