"""The webhook's HTTPS server: a fixed pool of workers, every read and write on a deadline.

The API server calls the webhook with a timeout of a few seconds and `failurePolicy:
Ignore`, so a slow answer only costs the gate. What any pod that reaches the port could
do to the process is bounded: at most `workers` connections are served at once, each
must complete its TLS handshake and send its request within `read_timeout`, and the
answer is written within the same deadline. Further connections wait in the kernel's
accept queue of `backlog`; nothing is spawned per connection.
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, HTTPServer
from queue import Full, Queue

log = logging.getLogger(__name__)

Handler = Callable[[str, bytes], tuple[int, bytes]]  # (path, body) -> (status, JSON body)


@dataclass(frozen=True)
class Limits:
    workers: int = 4
    backlog: int = 64
    read_timeout: float = 5.0
    max_body: int = 3 << 20


class _Server(HTTPServer):
    """HTTPServer whose accepted sockets go to a bounded queue served by a worker pool."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: Handler, limits: Limits) -> None:
        self.request_queue_size = limits.backlog
        self.app = handler
        self.limits = limits
        self.pending: Queue[tuple[socket.socket, object] | None] = Queue(limits.backlog)
        self.refused = 0
        super().__init__(address, _RequestHandler)

    def process_request(self, request: socket.socket, client_address: object) -> None:  # type: ignore[override]
        try:
            self.pending.put_nowait((request, client_address))
        except Full:
            self.refused += 1
            self.shutdown_request(request)

    def work(self) -> None:
        while (item := self.pending.get()) is not None:
            request, client_address = item
            try:
                request.settimeout(self.limits.read_timeout)
                if isinstance(request, ssl.SSLSocket):
                    request.do_handshake()
                self.finish_request(request, client_address)
            except Exception as exc:  # one peer's failure never stops a worker
                log.debug("webhook connection failed", extra={"error": str(exc)})
            finally:
                self.shutdown_request(request)


class _RequestHandler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or -1)
        if not 0 <= length <= self.server.limits.max_body:
            self._answer(413, b'{"message": "body too large or without a length"}')
            return
        status, body = self.server.app(self.path, self.rfile.read(length))
        self._answer(status, body)

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    def log_message(self, format: str, *args: object) -> None:
        log.debug("webhook request", extra={"request": format % args})


@dataclass
class WebhookServer:
    """Serves `handler` over TLS with the certificate at `cert`/`key` (reloadable)."""

    address: tuple[str, int]
    handler: Handler
    cert: str
    key: str
    limits: Limits = Limits()

    def start(self) -> None:
        self._server = _Server(self.address, self.handler, self.limits)
        self._tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._tls.minimum_version = ssl.TLSVersion.TLSv1_2
        self.reload()
        self._server.socket = self._tls.wrap_socket(
            self._server.socket, server_side=True, do_handshake_on_connect=False
        )
        self._threads = [
            threading.Thread(target=self._server.work, name=f"webhook-{i}", daemon=True)
            for i in range(self.limits.workers)
        ]
        self._threads.append(
            threading.Thread(target=self._server.serve_forever, name="webhook", daemon=True)
        )
        for t in self._threads:
            t.start()

    def reload(self) -> None:
        """Take up a rotated certificate: new handshakes use it, open ones keep theirs."""
        self._tls.load_cert_chain(self.cert, self.key)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def refused(self) -> int:
        return self._server.refused

    def stop(self, timeout: float = 5.0) -> None:
        self._server.shutdown()
        for _ in range(self.limits.workers):
            self._server.pending.put(None)
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        self._server.server_close()
