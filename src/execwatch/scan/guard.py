"""requests Sessions whose connections obey a `scan.egress.Watch`: the destination is
checked against its egress before connecting, and its deadline may shut the connection
down from another thread at any point (connect, TLS handshake, headers, body)."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.poolmanager import PoolManager

from execwatch.scan.egress import Deadline, Egress, EgressRefused, Watch


class _Guarded(HTTPConnection):
    """A connection that checks its destination against the Watch's egress, and that the
    Watch's deadline can shut down from another thread, at any point of its life."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.watch: Watch | None = None  # set by the pool
        self.owner: Deadline | None = None
        self._fd = -1  # the socket's descriptor: the same once TLS wraps the socket
        self._fd_lock = threading.Lock()

    def _new_conn(self) -> socket.socket:
        egress = self.watch.egress if self.watch is not None else None
        if egress is not None:
            _check_resolved(egress, self.host, self.port)
        sock = super()._new_conn()
        if egress is not None:
            kind = egress.refuses(str(sock.getpeername()[0]))
            if kind is not None:
                sock.close()
                raise EgressRefused(kind)
        with self._fd_lock:
            self._fd = sock.fileno()
        self._own()
        return sock

    def request(self, *args: Any, **kwargs: Any) -> None:
        self._own()  # a kept connection, now used by this thread's request
        super().request(*args, **kwargs)

    def _own(self) -> None:
        deadline = self.watch.deadline if self.watch is not None else None
        self.owner = deadline
        if deadline is not None:
            deadline.watch(self)

    def shut(self) -> None:
        """End whatever blocks on this connection (called from the deadline's thread). A
        closed connection's descriptor is -1 under the lock, so no other socket that
        reuses the number is touched."""
        with self._fd_lock:
            if self._fd < 0:
                return
            with contextlib.suppress(OSError), socket.socket(fileno=os.dup(self._fd)) as dup:
                dup.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        with self._fd_lock:
            self._fd = -1
            super().close()


def _check_resolved(egress: Egress, host: str, port: int | None) -> None:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        return  # the connection fails to resolve it too, and says so
    for info in infos:
        kind = egress.refuses(str(info[4][0]))
        if kind is not None:
            raise EgressRefused(kind)


class _GuardedHTTPS(_Guarded, HTTPSConnection):
    pass


def _watched(conn: object, watch: Watch | None) -> _Guarded:
    assert isinstance(conn, _Guarded)
    conn.watch = watch
    return conn


class _HTTPPool(HTTPConnectionPool):
    ConnectionCls = _Guarded
    watch: Watch | None = None

    def _new_conn(self) -> _Guarded:
        return _watched(super()._new_conn(), self.watch)


class _HTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _GuardedHTTPS
    watch: Watch | None = None

    def _new_conn(self) -> _GuardedHTTPS:
        conn = _watched(super()._new_conn(), self.watch)
        assert isinstance(conn, _GuardedHTTPS)
        return conn


class _PoolManager(PoolManager):
    def __init__(self, watch: Watch, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.watch = watch
        self.pool_classes_by_scheme = {"http": _HTTPPool, "https": _HTTPSPool}

    def _new_pool(
        self, scheme: str, host: str, port: int, request_context: dict[str, Any] | None = None
    ) -> HTTPConnectionPool:
        pool = super()._new_pool(scheme, host, port, request_context)
        assert isinstance(pool, _HTTPPool | _HTTPSPool)
        pool.watch = self.watch
        return pool


class GuardedAdapter(HTTPAdapter):
    """An HTTPAdapter whose connections obey `watch`."""

    def __init__(self, watch: Watch, connections: int) -> None:
        self.watch = watch  # before the base class makes the pool manager
        super().__init__(pool_connections=4, pool_maxsize=connections)

    def init_poolmanager(
        self, connections: int, maxsize: int, block: bool = False, **pool_kwargs: Any
    ) -> None:
        super().init_poolmanager(connections, maxsize, block, **pool_kwargs)
        self.poolmanager = _PoolManager(
            self.watch, num_pools=connections, maxsize=maxsize, block=block, **pool_kwargs
        )


def watch_of(session: requests.Session) -> Watch:
    adapter = session.get_adapter("https://")
    if not isinstance(adapter, GuardedAdapter):
        raise TypeError("a registry Session without a GuardedAdapter")
    return adapter.watch
