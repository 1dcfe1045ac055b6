"""The HTTP/1.1 server of every port execwatch opens: metrics, probes, the webhook.

One thread serves every connection through epoll. Connections persist (HTTP/1.1
keep-alive): after an answer the connection waits for its next request, one request at a
time, bytes that came early kept for the next one; a client's `Connection: close`, an
HTTP/1.0 request, a request the server cannot frame, or the `max_requests`-th answer end
it (the answer says `Connection: close`). Over TLS only HTTP/1.1 is negotiated (ALPN), so
a client that offers h2 (Go's net/http does) speaks HTTP/1.1.

What any peer that reaches the port can hold of the process is bounded (`ServerLimits`):
past `max_connections`, a connection still waiting for its request is closed at once
(an idle kept-alive one first; of the address holding the most; the oldest), or the new
one if every slot is busy answering; a request (TLS handshake, headers and body) must
arrive within `read_timeout` of its first byte (of the connection, for the first one),
its answer be taken within `write_timeout`; a kept-alive connection that sends nothing is
closed after `idle_timeout`. Idle or slow peers cost a socket, never a thread. With an
`ssl.SSLContext` the handshake runs in the same loop, non-blocking. An answer that needs
another thread's work (a call to the API server) is `Deferred`: the loop goes on serving
the others and writes that answer when the work is done, or at its deadline, whichever
comes first.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

CHUNK = 65536


@dataclass(frozen=True)
class ServerLimits:
    max_connections: int = 32
    read_timeout: float = 5.0
    write_timeout: float = 10.0
    max_request: int = 8192  # bytes of the request line and headers
    max_body: int = 0  # bytes of a request body; 0: no method with a body is served
    # below the 90 s after which Go's clients (the API server's) drop an idle connection:
    # the server closes first, and a client never writes into a connection closed long ago
    idle_timeout: float = 60.0
    max_requests: int = 1000  # answers per connection, then `Connection: close`


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes = b""


@dataclass(frozen=True)
class Deferred:
    """An answer that waits for `work` (done on another thread). The loop thread calls
    `finish(work)` once it is done, or `finish(None)` at `deadline` (time.monotonic) if it
    is not: exactly once either way, unless the server shuts down first."""

    work: Future[Any]
    deadline: float
    finish: Callable[[Future[Any] | None], bytes]


Answer = Callable[[Request], "bytes | Deferred"]


class DropCounter(Protocol):
    """A prometheus Counter labelled by `type`: over_cap, timeout, oversize."""

    def labels(self, kind: str) -> _Incrementable: ...


class _Incrementable(Protocol):
    def inc(self, amount: float = 1) -> None: ...


def response(
    status: str,
    content_type: str,
    body: bytes,
    method: str = "GET",
    extra: tuple[tuple[str, str], ...] = (),
) -> bytes:
    """An answer; the server adds `Connection: close` when it is the connection's last."""
    head = [f"HTTP/1.1 {status}", f"Content-Type: {content_type}"]
    head += [f"Content-Length: {len(body)}"]
    head += [f"{k}: {v}" for k, v in extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + (b"" if method == "HEAD" else body)


_BAD_REQUEST = response("400 Bad Request", "text/plain", b"bad request\n")
_TOO_LARGE = response("413 Content Too Large", "text/plain", b"body too large\n")


@dataclass
class _Conn:
    sock: socket.socket
    peer: str
    deadline: float
    since: float  # when it began waiting for its current request: eviction takes the oldest
    handshaking: bool = False
    inbox: bytearray = field(default_factory=bytearray)
    outbox: memoryview | None = None
    deferred: Deferred | None = None  # unregistered from the selector while it waits
    answered: int = 0  # requests taken (answered or being answered)
    last: bool = False  # the answer being made ends the connection

    @property
    def idle(self) -> bool:
        """Kept alive after an answer, and nothing of the next request has come."""
        waiting = self.outbox is None and self.deferred is None
        return waiting and self.answered > 0 and not self.inbox


class BoundedServer:
    """Serves `answer` on `address` in a background thread until shutdown()."""

    def __init__(
        self,
        address: tuple[str, int],
        answer: Answer,
        limits: ServerLimits,
        dropped: DropCounter,
        tls: ssl.SSLContext | None = None,
        name: str = "http",
    ) -> None:
        host, port = address
        family, _, _, _, sockaddr = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind(sockaddr)
            self._listener.listen(128)
        except OSError:
            self._listener.close()
            raise
        self._listener.setblocking(False)
        if tls is not None:
            tls.set_alpn_protocols(["http/1.1"])  # never h2, which this server does not speak
        self._answer = answer
        self._limits = limits
        self._dropped = dropped
        self._tls = tls
        self._selector = selectors.DefaultSelector()
        self._conns: dict[int, _Conn] = {}
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)  # a worker thread's wake-up never blocks
        self._done: collections.deque[_Conn] = collections.deque()  # deferred work done
        self._buffered: collections.deque[_Conn] = collections.deque()  # next request came
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    @property
    def server_port(self) -> int:
        return int(self._listener.getsockname()[1])

    def start(self) -> None:
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._thread.start()

    def shutdown(self) -> None:
        self._stopping.set()
        with contextlib.suppress(BlockingIOError):  # a byte is waiting already
            self._wake_w.send(b"x")
        self._thread.join()
        for conn in list(self._conns.values()):
            self._close(conn)
        self._selector.close()
        for s in (self._listener, self._wake_r, self._wake_w):
            s.close()

    def _loop(self) -> None:
        while not self._stopping.is_set():
            for key, events in self._selector.select(self._next_timeout()):
                if key.fileobj is self._listener:
                    self._accept()
                elif key.fileobj is self._wake_r:
                    self._finish_done()
                elif key.data.sock.fileno() >= 0:
                    self._serve(key.data, events)
            self._expire()
            self._serve_buffered()

    def _next_timeout(self) -> float:
        if self._buffered:
            return 0.0
        if not self._conns:
            return 1.0
        soonest = min(c.deadline for c in self._conns.values())
        return max(0.0, soonest - time.monotonic())

    def _accept(self) -> None:
        while True:
            try:
                sock, peer = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # EMFILE and the like: the peer waits in the backlog
                time.sleep(0.1)  # the listener stays readable: do not spin
                return
            if len(self._conns) >= self._limits.max_connections and not self._evict():
                sock.close()
                self._dropped.labels("over_cap").inc()
                continue
            sock.setblocking(False)
            if self._tls is not None:
                sock = self._tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
            now = time.monotonic()
            conn = _Conn(sock, str(peer[0]), now + self._limits.read_timeout, now)
            conn.handshaking = self._tls is not None
            self._conns[sock.fileno()] = conn
            self._selector.register(sock, selectors.EVENT_READ, conn)

    def _evict(self) -> bool:
        """Close a connection still waiting for its request: an idle kept-alive one if
        there is one (its client reconnects at the cost of a handshake), the oldest of the
        address that holds the most: a flood of idle connections cycles through its own
        slots, and a probe or a caller from another address is answered."""
        waiting = [c for c in self._conns.values() if c.outbox is None and not c.deferred]
        if not waiting:
            return False
        pool = [c for c in waiting if c.idle] or waiting
        greediest = collections.Counter(c.peer for c in pool).most_common(1)[0][0]
        oldest = min((c for c in pool if c.peer == greediest), key=lambda c: c.since)
        self._drop(oldest, "over_cap")
        return True

    def _serve(self, conn: _Conn, events: int) -> None:
        try:
            if conn.handshaking:
                self._handshake(conn)
            elif events & selectors.EVENT_READ and conn.outbox is None:
                self._read(conn)
            elif events & selectors.EVENT_WRITE and conn.outbox is not None:
                self._write(conn)
        except ssl.SSLWantReadError:
            self._selector.modify(conn.sock, selectors.EVENT_READ, conn)
        except ssl.SSLWantWriteError:
            self._selector.modify(conn.sock, selectors.EVENT_WRITE, conn)
        except BlockingIOError:
            pass  # the registration already matches what the connection waits for
        except OSError:  # reset by the peer, a failed handshake
            self._close(conn)

    def _serve_buffered(self) -> None:
        """Take up the requests that came before the answer to the one before them was
        written (pipelined): one per connection and turn of the loop, so that a peer's
        many neither deepen the stack nor keep the loop from the others."""
        for _ in range(len(self._buffered)):
            conn = self._buffered.popleft()
            live = self._conns.get(conn.sock.fileno()) is conn
            if live and conn.outbox is None and conn.deferred is None and conn.inbox:
                try:
                    self._take(conn)
                except (ssl.SSLWantWriteError, ssl.SSLWantReadError, BlockingIOError):
                    pass  # _send registered it for EVENT_WRITE
                except OSError:
                    self._close(conn)

    def _handshake(self, conn: _Conn) -> None:
        assert isinstance(conn.sock, ssl.SSLSocket)
        conn.sock.do_handshake()
        conn.handshaking = False
        self._selector.modify(conn.sock, selectors.EVENT_READ, conn)
        self._read(conn)

    def _read(self, conn: _Conn) -> None:
        starting = conn.idle
        while True:
            data = conn.sock.recv(CHUNK)
            if not data:
                self._close(conn)
                return
            conn.inbox += data
            if not (isinstance(conn.sock, ssl.SSLSocket) and conn.sock.pending()):
                break
        if starting:  # the next request has begun: it has read_timeout, not idle_timeout
            conn.deadline = time.monotonic() + self._limits.read_timeout
        self._take(conn)

    def _take(self, conn: _Conn) -> None:
        """Answer the request in the inbox once it is whole."""
        request = self._complete(conn)
        if request is None:
            return
        reply = request if isinstance(request, bytes) else self._reply(request)
        if isinstance(reply, Deferred):
            self._defer(conn, reply)
            return
        self._send(conn, reply)

    def _send(self, conn: _Conn, reply: bytes) -> None:
        conn.outbox = memoryview(_closing(reply) if conn.last else reply)
        conn.deadline = time.monotonic() + self._limits.write_timeout
        self._selector.modify(conn.sock, selectors.EVENT_WRITE, conn)
        self._write(conn)

    def _defer(self, conn: _Conn, reply: Deferred) -> None:
        """Park the connection (no events: a peer cannot make the loop spin) until the
        work is done or its deadline, which bounds the wait even if the work never ends."""
        conn.deferred, conn.deadline = reply, reply.deadline
        self._selector.unregister(conn.sock)

        def done(_: Future[Any]) -> None:
            self._done.append(conn)
            with contextlib.suppress(OSError):  # shut down, or bytes wait already
                self._wake_w.send(b"d")

        reply.work.add_done_callback(done)

    def _finish_done(self) -> None:
        try:
            while self._wake_r.recv(CHUNK):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        while self._done:
            conn = self._done.popleft()
            if conn.deferred is not None and self._conns.get(conn.sock.fileno()) is conn:
                self._resume(conn, conn.deferred.work)

    def _resume(self, conn: _Conn, work: Future[Any] | None) -> None:
        assert conn.deferred is not None
        finish, conn.deferred = conn.deferred.finish, None
        self._selector.register(conn.sock, selectors.EVENT_WRITE, conn)
        try:
            reply = finish(work)
        except Exception:
            log.exception("finishing a deferred answer failed")
            reply = response("500 Internal Server Error", "text/plain", b"error\n")
        try:
            self._send(conn, reply)
        except (ssl.SSLWantWriteError, ssl.SSLWantReadError, BlockingIOError):
            pass  # registered for EVENT_WRITE already
        except OSError:
            self._close(conn)

    def _complete(self, conn: _Conn) -> Request | bytes | None:
        """The request once whole (or the error answer, the connection's last), taken out
        of the inbox; None: more is to come."""
        end = conn.inbox.find(b"\r\n\r\n")
        if end < 0 or end > self._limits.max_request:
            if end > self._limits.max_request or len(conn.inbox) > self._limits.max_request:
                self._drop(conn, "oversize")
            return None
        head = _parse(bytes(conn.inbox[:end]))
        length = _length(head[3]) if head is not None else None
        if head is None or length is None:
            return self._last(conn, _BAD_REQUEST)
        if length > self._limits.max_body:
            return self._last(conn, _TOO_LARGE)
        whole = end + 4 + length
        if len(conn.inbox) < whole:
            return None
        method, path, version, headers = head
        body = bytes(conn.inbox[end + 4 : whole])
        del conn.inbox[:whole]
        conn.answered += 1
        conn.last = not _keeps_alive(version, headers) or (
            conn.answered >= self._limits.max_requests
        )
        return Request(method, path, headers, body)

    def _last(self, conn: _Conn, reply: bytes) -> bytes:
        """An answer after which the rest of the inbox cannot be framed: it ends the
        connection."""
        conn.answered += 1
        conn.last = True
        conn.inbox.clear()
        return reply

    def _reply(self, request: Request) -> bytes | Deferred:
        try:
            return self._answer(request)
        except Exception:  # one answer failed: this request fails, the server lives on
            log.exception("answering %s %s failed", request.method, request.path)
            return response("500 Internal Server Error", "text/plain", b"error\n", request.method)

    def _write(self, conn: _Conn) -> None:
        assert conn.outbox is not None
        sent = conn.sock.send(conn.outbox)
        conn.outbox = conn.outbox[sent:]
        if not conn.outbox:
            self._answered(conn)

    def _answered(self, conn: _Conn) -> None:
        """The answer is written: close, or wait for the next request."""
        if conn.last:
            self._close(conn)
            return
        conn.outbox = None
        now = time.monotonic()
        conn.since = now
        self._selector.modify(conn.sock, selectors.EVENT_READ, conn)
        if conn.inbox:  # the next request has begun already
            conn.deadline = now + self._limits.read_timeout
            self._buffered.append(conn)
        else:
            conn.deadline = now + self._limits.idle_timeout

    def _expire(self) -> None:
        now = time.monotonic()
        for conn in [c for c in self._conns.values() if c.deadline <= now]:
            if conn.deferred is not None:  # its own answer to the deadline (a 503)
                work = conn.deferred.work
                self._resume(conn, work if work.done() else None)
            elif conn.idle:  # every request it sent was answered: not a drop
                self._close(conn)
            else:
                self._drop(conn, "timeout")

    def _drop(self, conn: _Conn, why: str) -> None:
        self._dropped.labels(why).inc()
        self._close(conn)

    def _close(self, conn: _Conn) -> None:
        self._conns.pop(conn.sock.fileno(), None)
        if conn.deferred is None:
            self._selector.unregister(conn.sock)
        conn.deferred = None
        conn.sock.close()


def _closing(reply: bytes) -> bytes:
    """`reply` with `Connection: close` after its status line."""
    status_end = reply.index(b"\r\n") + 2
    return reply[:status_end] + b"Connection: close\r\n" + reply[status_end:]


def _keeps_alive(version: str, headers: dict[str, str]) -> bool:
    """HTTP/1.1 persists unless the client says close; HTTP/1.0 is closed. A body sent
    chunked is not read (only Content-Length frames one), so nothing after it can be."""
    tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
    return version == "HTTP/1.1" and "close" not in tokens and "transfer-encoding" not in headers


def _length(headers: dict[str, str]) -> int | None:
    """The body's Content-Length (0 without one); None if it is not a length."""
    text = headers.get("content-length") or "0"
    if not (text.isascii() and text.isdigit()):
        return None
    return int(text)


def _parse(head: bytes) -> tuple[str, str, str, dict[str, str]] | None:
    """`METHOD PATH HTTP/1.x` and the headers, lower-cased; None if it is not that."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        return None
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep:
            return None
        headers[name.strip().lower()] = value.strip()
    return parts[0], urlsplit(parts[1]).path, parts[2], headers
