"""requests Sessions whose connections obey a `scan.egress.Watch`: every address the
destination's name resolves to is checked against the egress, and the connection goes to
a checked address itself (no second resolution: a name that answers differently the second
time gains nothing), with the name kept for SNI, the certificate and the Host header; the
deadline may shut the connection down from another thread at any point (connect, TLS
handshake, headers, body).

Only public urllib3 API: the pool classes by scheme, a pool's `ConnectionCls`, and a
connection's `connect()`, `host`, `server_hostname`, `assert_hostname`, `timeout` and
`sock`. Each Session has its own connection classes, which carry its Watch."""

from __future__ import annotations

import contextlib
import http.cookiejar
import os
import socket
import threading
from typing import Any, ClassVar

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import ConnectTimeoutError, NameResolutionError, NewConnectionError

from execwatch.scan.egress import Deadline, Egress, EgressRefused, Watch


class _Guarded(HTTPConnection):
    """A connection that goes only to addresses its Watch's egress allows, and that the
    Watch's deadline can shut down from another thread, at any point of its life."""

    watch: ClassVar[Watch]  # set by the Session's own subclass (`_pool_classes`)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # before the base class, whose __init__ already sets `sock`
        self._fd = -1  # the socket's descriptor: the same once TLS wraps the socket
        self._fd_lock = threading.Lock()
        self._held: Any = None
        self.owner: Deadline | None = None
        super().__init__(*args, **kwargs)

    @property
    def sock(self) -> Any:
        return self._held

    @sock.setter
    def sock(self, value: Any) -> None:
        """Set by urllib3 once the TCP connection is up, before the TLS handshake: from
        then on the deadline can shut the socket down. None on close, before the socket
        is closed, so no other socket that reuses the descriptor is ever touched."""
        with self._fd_lock:
            self._held = value
            self._fd = value.fileno() if value is not None else -1
        if value is not None:
            self._own()

    def connect(self) -> None:
        self._bound_by_deadline()
        egress = self.watch.egress
        if egress is None:
            super().connect()
            return
        name = self.host
        self._name_for_tls(name)
        try:
            addresses = _checked_addresses(egress, name, self.port)
        except socket.gaierror as exc:
            raise NameResolutionError(name, self, exc) from exc
        failed: Exception | None = None
        for address in addresses:
            self.host = address  # the checked address itself, never resolved again
            try:
                super().connect()
                return
            except (NewConnectionError, ConnectTimeoutError) as exc:
                failed = exc  # the next address, as a resolved name's connection does
            finally:
                self.host = name
        assert failed is not None  # getaddrinfo answers at least one address or raises
        raise failed

    def _bound_by_deadline(self) -> None:
        """Connect and TLS handshake end by the deadline, even before `sock` is set."""
        deadline = self.watch.deadline
        if deadline is None:
            return
        left = max(0.001, deadline.left())
        current = self.timeout if isinstance(self.timeout, int | float) else None
        self.timeout = left if current is None else min(current, left)

    def _name_for_tls(self, name: str) -> None:
        """The name SNI sends and the certificate must hold (HTTPS only)."""

    def request(self, *args: Any, **kwargs: Any) -> None:
        self._own()  # a kept connection, now used by this thread's request
        super().request(*args, **kwargs)

    def _own(self) -> None:
        deadline = self.watch.deadline
        self.owner = deadline
        if deadline is not None:
            deadline.watch(self)

    def shut(self) -> None:
        """End whatever blocks on this connection (called from the deadline's thread)."""
        with self._fd_lock:
            if self._fd < 0:
                return
            with contextlib.suppress(OSError), socket.socket(fileno=os.dup(self._fd)) as dup:
                dup.shutdown(socket.SHUT_RDWR)


class _GuardedHTTPS(_Guarded, HTTPSConnection):
    def _name_for_tls(self, name: str) -> None:
        if self.server_hostname is None:
            self.server_hostname = name
        if self.assert_hostname is None:
            self.assert_hostname = name


def _checked_addresses(egress: Egress, host: str, port: int | None) -> list[str]:
    """Every address `host` resolves to, each allowed by `egress`: one refused refuses
    the destination before any connection."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    for address in addresses:
        kind = egress.refuses(address)
        if kind is not None:
            raise EgressRefused(kind)
    return addresses


def _pool_classes(watch: Watch) -> dict[str, type[HTTPConnectionPool]]:
    """Pool classes whose connections obey `watch`, for one Session."""

    class Plain(_Guarded):
        pass

    class Secure(_GuardedHTTPS):
        pass

    Plain.watch = Secure.watch = watch

    class PlainPool(HTTPConnectionPool):
        ConnectionCls = Plain

    class SecurePool(HTTPSConnectionPool):
        ConnectionCls = Secure

    return {"http": PlainPool, "https": SecurePool}


class NoCookies(http.cookiejar.DefaultCookiePolicy):
    """A Session's policy: a registry's cookies are never kept nor sent."""

    def set_ok(self, cookie: http.cookiejar.Cookie, request: object) -> bool:
        return False

    def return_ok(self, cookie: http.cookiejar.Cookie, request: object) -> bool:
        return False


class GuardedAdapter(HTTPAdapter):
    """An HTTPAdapter whose connections obey `watch`."""

    def __init__(self, watch: Watch, connections: int) -> None:
        self.watch = watch  # before the base class makes the pool manager
        super().__init__(pool_connections=4, pool_maxsize=connections)

    def init_poolmanager(
        self, connections: int, maxsize: int, block: bool = False, **pool_kwargs: Any
    ) -> None:
        super().init_poolmanager(connections, maxsize, block, **pool_kwargs)
        self.poolmanager.pool_classes_by_scheme = _pool_classes(self.watch)


def watch_of(session: requests.Session) -> Watch:
    adapter = session.get_adapter("https://")
    if not isinstance(adapter, GuardedAdapter):
        raise TypeError("a registry Session without a GuardedAdapter")
    return adapter.watch
