"""A fault-injecting HTTPS proxy on loopback, in front of the real kube-apiserver.

It terminates TLS with the API server's own serving certificate (valid for 127.0.0.1,
so clients keep verifying against the cluster CA), forwards each HTTP/1.1 request on a
connection of its own to the API server, and for a chosen share of requests instead:

- `refuse_429` / `refuse_500` / `refuse_503`: answers itself with a Status, without forwarding;
- `refuse_429_apf`: answers as kube-apiserver's priority-and-fairness filter rejects a
  request (`tooManyRequests` in apiserver/pkg/server/filters/priority-and-fairness.go):
  429, Retry-After, and a text/plain body, not a Status;
- `delay`: waits 20-300 ms, then forwards;
- `reset_before`: resets the client's connection without forwarding;
- `drop_reply`: forwards, lets the API server act, then closes without answering;
- `reset_after`: forwards, lets the API server act, then resets the connection;
- watches (`watch=true`) are cut after a random 0.2-3 s instead (`cut_watch`).

`faults` counts what was injected. The decision is random with a seed, and only for
requests `select` accepts (the test picks which identities and verbs suffer).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import random
import socket
import ssl
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

KINDS = (  # the default mix
    "refuse_429",
    "refuse_429_apf",
    "refuse_500",
    "refuse_503",
    "delay",
    "reset_before",
    "drop_reply",
    "reset_after",
)
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length"}


@dataclass
class Request:
    method: str
    target: str
    headers: list[tuple[str, str]]
    body: bytes

    @property
    def is_watch(self) -> bool:
        return "watch=true" in self.target or "watch=1" in self.target


@dataclass
class FaultProxy:
    upstream_port: int
    cert: Path
    key: Path
    ca: Path
    rate: float = 0.3  # share of selected requests that get a fault
    seed: int = 1
    select: Callable[[Request], bool] = lambda req: True
    kinds: tuple[str, ...] = KINDS  # faults to choose from
    faults: Counter[str] = field(default_factory=Counter)
    requests: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _sock: socket.socket | None = None
    _stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self._random = random.Random(self.seed)
        self._server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._server_ctx.load_cert_chain(str(self.cert), str(self.key))
        self._client_ctx = ssl.create_default_context(cafile=str(self.ca))

    @property
    def url(self) -> str:
        assert self._sock is not None
        return f"https://127.0.0.1:{self._sock.getsockname()[1]}"

    def start(self) -> FaultProxy:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)
        sock.settimeout(0.2)
        self._sock = sock
        threading.Thread(target=self._accept, name="faultproxy", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._sock is not None:
            self._sock.close()

    def total(self) -> int:
        with self._lock:
            return sum(self.faults.values())

    # -- plumbing ----------------------------------------------------------------------

    def _accept(self) -> None:
        assert self._sock is not None
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except (TimeoutError, OSError):
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, raw: socket.socket) -> None:
        try:
            conn = self._server_ctx.wrap_socket(raw, server_side=True)
        except (OSError, ssl.SSLError):
            raw.close()
            return
        upstream = http.client.HTTPSConnection(
            "127.0.0.1", self.upstream_port, context=self._client_ctx, timeout=120
        )
        rfile = conn.makefile("rb")
        try:
            while not self._stop.is_set():
                req = _read_request(rfile)
                if req is None:
                    return
                if not self._one(conn, upstream, req):
                    return
        except (OSError, ssl.SSLError, http.client.HTTPException, ValueError):
            return
        finally:
            upstream.close()
            with contextlib.suppress(OSError):
                conn.close()

    def _choose(self, req: Request) -> str | None:
        with self._lock:
            self.requests += 1
            if not self.select(req) or self._random.random() >= self.rate:
                return None
            kind = "cut_watch" if req.is_watch else self._random.choice(self.kinds)
            self.faults[kind] += 1
            return kind

    def _one(
        self, conn: ssl.SSLSocket, upstream: http.client.HTTPSConnection, req: Request
    ) -> bool:
        """Serve one request; False when the connection is finished."""
        fault = self._choose(req)
        if fault == "refuse_429_apf":
            _answer_plain(conn, 429, b"Too many requests, please try again later.\n")
            return True
        if fault and fault.startswith("refuse_"):
            status = int(fault.removeprefix("refuse_"))
            _answer(conn, status, {"Retry-After": "0"} if status == 429 else {})
            return True
        if fault == "reset_before":
            _reset(conn)
            return False
        if fault == "delay":
            time.sleep(self._random.uniform(0.02, 0.3))
        headers = {k: v for k, v in req.headers if k.lower() not in HOP_BY_HOP | {"host"}}
        upstream.request(req.method, req.target, body=req.body or None, headers=headers)
        resp = upstream.getresponse()
        if fault == "cut_watch":
            return self._stream(conn, upstream, resp, self._random.uniform(0.2, 3.0))
        if req.is_watch:
            return self._stream(conn, upstream, resp, None)
        body = resp.read()
        if fault == "drop_reply":
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            return False
        if fault == "reset_after":
            _reset(conn)
            return False
        head = [f"HTTP/1.1 {resp.status} {resp.reason}"]
        head += [f"{k}: {v}" for k, v in resp.getheaders() if k.lower() not in HOP_BY_HOP]
        head += [f"Content-Length: {len(body)}", "", ""]
        conn.sendall("\r\n".join(head).encode() + body)
        return True

    def _stream(
        self,
        conn: ssl.SSLSocket,
        upstream: http.client.HTTPSConnection,
        resp: http.client.HTTPResponse,
        cut_after: float | None,
    ) -> bool:
        head = [f"HTTP/1.1 {resp.status} {resp.reason}"]
        head += [f"{k}: {v}" for k, v in resp.getheaders() if k.lower() not in HOP_BY_HOP]
        head += ["Transfer-Encoding: chunked", "", ""]
        conn.sendall("\r\n".join(head).encode())
        timer = None
        if cut_after is not None:

            def cut() -> None:
                _reset(conn)
                with contextlib.suppress(OSError):
                    if upstream.sock is not None:
                        upstream.sock.shutdown(socket.SHUT_RDWR)

            timer = threading.Timer(cut_after, cut)
            timer.daemon = True
            timer.start()
        try:
            while not self._stop.is_set():
                data = resp.read1(65536)
                if not data:
                    conn.sendall(b"0\r\n\r\n")
                    break
                conn.sendall(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        finally:
            if timer is not None:
                timer.cancel()
        return False  # one watch per connection: the client opens a new one


def _read_request(rfile: object) -> Request | None:
    readline = rfile.readline  # type: ignore[attr-defined]
    line = readline(65537)
    if not line:
        return None
    method, target, _version = line.decode("latin-1").rstrip("\r\n").split(" ", 2)
    headers: list[tuple[str, str]] = []
    while True:
        h = readline(65537).decode("latin-1").rstrip("\r\n")
        if not h:
            break
        k, _, v = h.partition(":")
        headers.append((k.strip(), v.strip()))
    length = next((int(v) for k, v in headers if k.lower() == "content-length"), 0)
    if any(k.lower() == "transfer-encoding" for k, _ in headers):
        raise ValueError("chunked request bodies are not supported")
    body = rfile.read(length) if length else b""  # type: ignore[attr-defined]
    return Request(method, target, headers, body)


def _answer_plain(conn: ssl.SSLSocket, status: int, body: bytes) -> None:
    head = [f"HTTP/1.1 {status} Too Many Requests", "Content-Type: text/plain; charset=utf-8"]
    head += ["Retry-After: 1", "X-Content-Type-Options: nosniff"]
    head += [f"Content-Length: {len(body)}", "", ""]
    conn.sendall("\r\n".join(head).encode() + body)


def _answer(conn: ssl.SSLSocket, status: int, extra: dict[str, str]) -> None:
    body = json.dumps(
        {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "code": status,
            "reason": "InjectedFault",
            "message": f"fault injected: {status}",
        }
    ).encode()
    head = [f"HTTP/1.1 {status} Injected", "Content-Type: application/json"]
    head += [f"{k}: {v}" for k, v in extra.items()]
    head += [f"Content-Length: {len(body)}", "", ""]
    conn.sendall("\r\n".join(head).encode() + body)


def _reset(conn: ssl.SSLSocket) -> None:
    """Close with an RST, as a crashed middlebox or a lost connection does."""
    with contextlib.suppress(OSError):
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()
