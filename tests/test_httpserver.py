"""Persistent connections of execwatch's bounded HTTP/1.1 server (serving/http.py).

The real `BoundedServer` on loopback, in this process, spoken to through real sockets
(plain and TLS): requests on one connection, the idle timeout, eviction of idle kept-alive
connections at the cap, the client's `Connection: close`, a slow second request, deferred
answers. The bounds a fresh connection has are tested on the metrics server in
tests/cluster/test_metrics_server.py.
"""

from __future__ import annotations

import datetime as dt
import http.client
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import ExitStack, closing
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter

from execwatch.serving.certs import issue
from execwatch.serving.http import BoundedServer, Deferred, Request, ServerLimits, response


@dataclass
class Served:
    server: BoundedServer
    registry: CollectorRegistry
    seen: list[Request]

    @property
    def port(self) -> int:
        return self.server.server_port

    def dropped(self, kind: str) -> float:
        return self.registry.get_sample_value("dropped_total", {"type": kind}) or 0.0

    def connect(self, source: str = "127.0.0.1") -> socket.socket:
        s = socket.socket()
        s.bind((source, 0))
        s.connect(("127.0.0.1", self.port))
        s.settimeout(5.0)
        return s


Start = Callable[..., Served]


@pytest.fixture
def start() -> Iterator[Start]:
    """start(limits, tls=None, answer=None) -> Served: a server answering `METHOD PATH`
    (or with `answer`), stopped at the end of the test."""
    with ExitStack() as stack:

        def run(
            limits: ServerLimits,
            tls: ssl.SSLContext | None = None,
            answer: Callable[[Request], bytes | Deferred] | None = None,
        ) -> Served:
            registry, seen = CollectorRegistry(), []
            dropped = Counter("dropped", "drops", ["type"], registry=registry)

            def echo(request: Request) -> bytes | Deferred:
                seen.append(request)
                if answer is not None:
                    return answer(request)
                text = f"{request.method} {request.path} {request.body.decode()}\n"
                return response("200 OK", "text/plain", text.encode(), request.method)

            server = BoundedServer(("127.0.0.1", 0), echo, limits, dropped, tls)
            server.start()
            stack.callback(server.shutdown)
            return Served(server, registry, seen)

        yield run


@dataclass(frozen=True)
class Answer:
    status: str
    headers: dict[str, str]
    body: bytes


def read_answer(s: socket.socket, buffered: bytearray) -> Answer:
    """One answer from `s` (what is read past it stays in `buffered`)."""
    while b"\r\n\r\n" not in buffered:
        chunk = s.recv(65536)
        assert chunk, f"closed before an answer: {bytes(buffered)!r}"
        buffered += chunk
    end = buffered.index(b"\r\n\r\n")
    status, *lines = bytes(buffered[:end]).decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (li.partition(":") for li in lines)}
    whole = end + 4 + int(headers["content-length"])
    while len(buffered) < whole:
        chunk = s.recv(65536)
        assert chunk, "closed within the body"
        buffered += chunk
    body = bytes(buffered[end + 4 : whole])
    del buffered[:whole]
    return Answer(status, headers, body)


def closed_by_server(s: socket.socket) -> bool:
    """The server closed `s`: end of file, or a reset if it left our bytes unread."""
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


def get(path: str, *headers: str) -> bytes:
    lines = [f"GET {path} HTTP/1.1", "Host: x", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def post(path: str, body: bytes) -> bytes:
    return f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body


def kept_alive(served: Served, source: str = "127.0.0.1") -> socket.socket:
    """A connection that had one request answered and now waits for its next."""
    s = served.connect(source)
    s.sendall(get("/first"))
    assert read_answer(s, bytearray()).status == "HTTP/1.1 200 OK"
    return s


LIMITS = ServerLimits(max_connections=8, read_timeout=5.0, idle_timeout=30.0, max_body=1024)


def test_requests_on_one_connection_are_each_answered(start: Start) -> None:
    served = start(LIMITS)
    with closing(served.connect()) as s:
        buffered = bytearray()
        s.sendall(get("/one"))
        first = read_answer(s, buffered)
        s.sendall(post("/two", b"body"))
        second = read_answer(s, buffered)
        s.sendall(get("/three") + get("/four"))  # pipelined: answered in order
        third, fourth = read_answer(s, buffered), read_answer(s, buffered)
    assert [a.body for a in (first, second, third, fourth)] == [
        b"GET /one \n",
        b"POST /two body\n",
        b"GET /three \n",
        b"GET /four \n",
    ]
    assert all("connection" not in a.headers for a in (first, second, third, fourth))
    assert served.dropped("timeout") == served.dropped("over_cap") == 0


def test_the_clients_connection_close_or_http_1_0_ends_the_connection(start: Start) -> None:
    served = start(LIMITS)
    for request in (get("/x", "Connection: close"), b"GET /x HTTP/1.0\r\n\r\n"):
        with closing(served.connect()) as s:
            s.sendall(request)
            answer = read_answer(s, bytearray())
            assert answer.status == "HTTP/1.1 200 OK"
            assert answer.headers["connection"] == "close"
            assert closed_by_server(s)


def test_an_idle_connection_is_closed_after_the_idle_timeout(start: Start) -> None:
    served = start(ServerLimits(read_timeout=5.0, idle_timeout=0.5))
    with closing(kept_alive(served)) as s:
        began = time.monotonic()
        assert closed_by_server(s)
        assert 0.3 < time.monotonic() - began < 3.0  # well before the read timeout
    assert served.dropped("timeout") == 0, "every request it sent was answered"


def test_a_slow_second_request_is_cut_at_the_read_timeout(start: Start) -> None:
    """A slowloris that behaves for one request: the next one has read_timeout from its
    first byte, however long the idle timeout."""
    served = start(ServerLimits(read_timeout=0.5, idle_timeout=30.0))
    with closing(kept_alive(served)) as s:
        began = time.monotonic()
        for byte in get("/slow")[:-1]:
            try:
                s.send(bytes([byte]))
            except OSError:  # reset: closed by the server
                break
            time.sleep(0.05)
            if time.monotonic() - began > 3.0:
                break
        assert closed_by_server(s)
        assert 0.3 < time.monotonic() - began < 3.0
    assert served.dropped("timeout") == 1


def test_idle_kept_alive_connections_are_evicted_first_past_the_cap(start: Start) -> None:
    """Two connections waiting for their first request, older than the idle ones and from
    an address holding as many: still, an idle kept-alive one goes first, the oldest."""
    served = start(ServerLimits(max_connections=4, read_timeout=10.0, idle_timeout=30.0))
    with ExitStack() as stack:
        fresh = [stack.enter_context(closing(served.connect("127.0.0.2"))) for _ in range(2)]
        time.sleep(0.1)
        older = stack.enter_context(closing(kept_alive(served)))
        newer = stack.enter_context(closing(kept_alive(served)))
        newest = stack.enter_context(closing(served.connect("127.0.0.3")))  # over the cap
        older.settimeout(2.0)
        assert closed_by_server(older)
        assert served.dropped("over_cap") == 1
        for s in (*fresh, newer, newest):
            s.sendall(get("/still"))
            assert read_answer(s, bytearray()).body == b"GET /still \n"


def test_the_last_allowed_request_ends_the_connection(start: Start) -> None:
    served = start(ServerLimits(max_requests=2))
    with closing(served.connect()) as s:
        buffered = bytearray()
        s.sendall(get("/1"))
        assert "connection" not in read_answer(s, buffered).headers
        s.sendall(get("/2"))
        assert read_answer(s, buffered).headers["connection"] == "close"
        assert closed_by_server(s)


def test_a_request_that_cannot_be_framed_ends_the_connection(start: Start) -> None:
    served = start(LIMITS)
    for request, status in (
        (b"GET /x HTTP/1.1\r\nContent-Length: x\r\n\r\nGET /y HTTP/1.1\r\n\r\n", "400 "),
        (b"POST /x HTTP/1.1\r\nContent-Length: 2048\r\n\r\n", "413 "),
    ):
        with closing(served.connect()) as s:
            s.sendall(request)
            answer = read_answer(s, bytearray())
            assert answer.status.startswith(f"HTTP/1.1 {status}")
            assert answer.headers["connection"] == "close"
            assert closed_by_server(s)
    assert served.seen == [], "nothing after the bad request was taken as a request"


def test_a_deferred_answer_keeps_the_connection(start: Start) -> None:
    def later(request: Request) -> bytes | Deferred:
        work: Future[bytes] = Future()
        threading.Timer(0.2, work.set_result, [f"done {request.path}\n".encode()]).start()

        def finish(done: Future[bytes] | None) -> bytes:
            body = done.result() if done is not None else b"late\n"
            return response("200 OK", "text/plain", body)

        return Deferred(work, time.monotonic() + 5.0, finish)

    served = start(LIMITS, answer=later)
    with closing(served.connect()) as s:
        buffered = bytearray()
        s.sendall(get("/a"))
        assert read_answer(s, buffered).body == b"done /a\n"
        s.sendall(get("/b") + get("/c"))
        assert read_answer(s, buffered).body == b"done /b\n"
        assert read_answer(s, buffered).body == b"done /c\n"


@pytest.fixture
def tls(tmp_path: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(the server's context, a client's that trusts it) for `localhost`."""
    bundle = issue(["localhost"], dt.datetime.now(dt.UTC))
    for name, data in (("tls.crt", bundle.cert), ("tls.key", bundle.key), ("ca", bundle.ca_cert)):
        (tmp_path / name).write_bytes(data)
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    return server, ssl.create_default_context(cafile=str(tmp_path / "ca"))


def test_over_tls_one_handshake_serves_many_requests_in_http_1_1(
    start: Start, tls: tuple[ssl.SSLContext, ssl.SSLContext]
) -> None:
    """A client that offers h2 first, as Go's net/http does, gets HTTP/1.1."""
    server_tls, client_tls = tls
    client_tls.set_alpn_protocols(["h2", "http/1.1"])
    served = start(LIMITS, server_tls)
    conn = http.client.HTTPSConnection("localhost", served.port, context=client_tls, timeout=5)
    with closing(conn):
        conn.request("POST", "/review0", body=b"{}")
        bodies = [conn.getresponse().read()]
        first = conn.sock
        assert isinstance(first, ssl.SSLSocket)
        assert first.selected_alpn_protocol() == "http/1.1"
        for i in (1, 2):
            conn.request("POST", f"/review{i}", body=b"{}")
            bodies.append(conn.getresponse().read())
            assert conn.sock is first, "the same connection: no new handshake"
    assert bodies == [f"POST /review{i} {{}}\n".encode() for i in range(3)]
