"""A TLS reverse proxy on loopback in front of a real registry that records every request
it passes and every connection it accepts: what a client asked the registry for, and how
many TLS connections it opened to ask it.

It serves the registry's own certificate (tests/kube make_pki: 127.0.0.1), so a client
that trusts the registry's CA trusts the proxy; the registry sees the client's headers
(its credentials) unchanged.
"""

from __future__ import annotations

import http.client
import http.server
import ssl
import threading
from dataclasses import dataclass, field

from tests.support.registry.registry_server import Registry

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length"}


@dataclass
class CountingProxy:
    registry: Registry
    requests: list[tuple[str, str]] = field(default_factory=list)  # (method, path)
    connections: int = 0

    def __post_init__(self) -> None:
        proxy = self
        upstream = ssl.create_default_context(cafile=str(self.registry.ca))

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive: the client may reuse the connection

            def setup(self) -> None:
                super().setup()
                with proxy._lock:
                    proxy.connections += 1

            def do_GET(self) -> None:
                self._forward()

            def do_HEAD(self) -> None:
                self._forward()

            def _forward(self) -> None:
                with proxy._lock:
                    proxy.requests.append((self.command, self.path))
                conn = http.client.HTTPSConnection(proxy.registry.host, context=upstream)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                conn.request(self.command, self.path, headers=headers)
                answer = conn.getresponse()
                body = answer.read()
                conn.close()
                self.send_response(answer.status)
                for key, value in answer.getheaders():
                    if key.lower() not in HOP_BY_HOP:
                        self.send_header(key, value)
                length = answer.getheader("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", length or str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self._lock = threading.Lock()
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        pki = self.registry.pki
        served.load_cert_chain(pki / "serving.crt", pki / "serving.key")
        self.httpd.socket = served.wrap_socket(self.httpd.socket, server_side=True)
        self.host = f"127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def asked(self, kind: str = "") -> list[tuple[str, str]]:
        """The requests for `/v2/…/{kind}/…` ('manifests', 'blobs'), or all of them."""
        with self._lock:
            return [(m, p) for m, p in self.requests if not kind or f"/{kind}/" in p]

    def reset(self) -> None:
        with self._lock:
            self.requests.clear()
            self.connections = 0

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
