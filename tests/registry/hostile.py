"""Registries on loopback that misbehave on purpose, and raw pushes to the real one.

- `Scripted`: an HTTP(S) server whose every answer a test writes (a redirect, a bearer
  challenge, a body); it records what it was asked, with the Authorization headers.
- `Dripping`: a registry that sends its answer one byte every `interval` seconds, in the
  status line and headers or in the body: the slow loris that per-read timeouts never stop.
- `push_blob` / `push_manifest`: bytes into the real registry exactly as given (a config
  of 4 MiB of `{}`, an index of any manifests), over its HTTP API.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.server
import json
import socket
import ssl
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.kube.apiserver import make_pki
from tests.support.registry.registry_server import PASSWORD, USER, Registry


@dataclass
class Answer:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


@dataclass(frozen=True)
class Asked:
    method: str
    path: str
    authorization: str


class Scripted:
    """Answers each request with `answer(method, path)`; `pki` set: over TLS with its
    serving certificate (tests.support.kube.apiserver.make_pki, for 127.0.0.1)."""

    def __init__(self, answer: Callable[[str, str], Answer], pki: Path | None = None) -> None:
        self.asked: list[Asked] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self._answer("GET")

            def do_HEAD(self) -> None:
                self._answer("HEAD")

            def _answer(self, method: str) -> None:
                auth = self.headers.get("Authorization", "")
                server.asked.append(Asked(method, self.path, auth))
                got = answer(method, self.path)
                self.send_response(got.status)
                for key, value in got.headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(got.body)))
                self.end_headers()
                if method == "GET":
                    self.wfile.write(got.body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.scheme = "http"
        if pki is not None:
            ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ctx.load_cert_chain(pki / "serving.crt", pki / "serving.key")
            self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
            self.scheme = "https"
        self.host = f"127.0.0.1:{self.httpd.server_address[1]}"
        self.url = f"{self.scheme}://{self.host}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def loopback_pki(d: Path) -> Path:
    """A CA and a serving certificate for 127.0.0.1; the CA is d/ca.crt."""
    make_pki(d)
    return d


class Dripping:
    """A registry that answers every request one byte per `interval` seconds: `where` is
    "handshake" (a TLS registry: its ServerHello record drips), "headers" (plain HTTP:
    the status line itself drips) or "body" (whole headers that announce a manifest, whose
    body drips). Counts the connections it accepted."""

    def __init__(self, where: str, interval: float = 0.5) -> None:
        self.where, self.interval = where, interval
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.host = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.accepted = 0
        self.closed_by_client = threading.Event()
        self._stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._drip, args=(conn,), daemon=True).start()

    def _drip(self, conn: socket.socket) -> None:
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/vnd.oci.image.manifest.v1+json\r\n"
        head += b"Content-Length: 100000\r\n\r\n"
        with conn:
            conn.recv(65536)  # the request
            if self.where == "body":
                conn.sendall(head)
            data = {
                "handshake": b"\x16\x03\x03\x00\x60\x02" + bytes(0x5F),  # a TLS record, 5 + 96 B
                "headers": head,
                "body": b"{" + b" " * 99999,
            }[self.where]
            try:
                for byte in data:
                    if self._stop.is_set():
                        return
                    conn.sendall(bytes([byte]))
                    time.sleep(self.interval)
            except OSError:
                self.closed_by_client.set()

    def close(self) -> None:
        self._stop.set()
        self.listener.close()


# --- raw pushes to the real registry --------------------------------------------------------


def _request(registry: Registry, method: str, url: str, **how: Any) -> Any:
    token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    headers = {"Authorization": f"Basic {token}", **how.pop("headers", {})}
    request = urllib.request.Request(url, method=method, headers=headers, **how)
    ctx = ssl.create_default_context(cafile=str(registry.ca))
    return urllib.request.urlopen(request, context=ctx, timeout=60)


def push_blob(registry: Registry, repo: str, data: bytes, media_type: str) -> dict[str, Any]:
    """Upload `data` as a blob of `repo` (monolithic); its descriptor."""
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    base = f"https://{registry.host}"
    with _request(registry, "POST", f"{base}/v2/{repo}/blobs/uploads/", data=b"") as started:
        location = started.headers["Location"]
    url = location if location.startswith("http") else base + location
    url += ("&" if "?" in url else "?") + f"digest={digest}"
    octets = {"Content-Type": "application/octet-stream"}
    with _request(registry, "PUT", url, data=data, headers=octets):
        pass
    return {"mediaType": media_type, "digest": digest, "size": len(data)}


def push_manifest(
    registry: Registry, repo: str, ref: str, doc: dict[str, Any], media_type: str
) -> dict[str, Any]:
    """PUT `doc` as the manifest or index `repo:ref`; its descriptor."""
    body = json.dumps(doc).encode()
    url = f"https://{registry.host}/v2/{repo}/manifests/{ref}"
    with _request(registry, "PUT", url, data=body, headers={"Content-Type": media_type}):
        pass
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    return {"mediaType": media_type, "digest": digest, "size": len(body)}


@contextlib.contextmanager
def closing(server: Scripted | Dripping) -> Any:
    try:
        yield server
    finally:
        server.close()
