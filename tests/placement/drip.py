"""A slow-loris registry on loopback: it answers every request with one byte of a status
line every `every` seconds, forever, so a client whose timeout is per socket read never
times out. It counts the connections it holds open."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

# A status line, then a header line that never ends.
ANSWER = b"HTTP/1.1 200 OK\r\nDocker-Distribution-Api-Version: registry/2.0"


@dataclass
class DripRegistry:
    every: float = 0.5
    _listener: socket.socket = field(default_factory=socket.socket)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _open: set[socket.socket] = field(default_factory=set)

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self._listener.getsockname()[1]}"

    def holding(self) -> int:
        """Connections being dripped to now."""
        with self._lock:
            return len(self._open)

    def start(self) -> None:
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self._listener.settimeout(0.2)
        threading.Thread(target=self._accept, daemon=True, name="drip-accept").start()

    def stop(self) -> None:
        self._stop.set()
        self._listener.close()
        with self._lock:
            for conn in self._open:
                conn.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except (TimeoutError, OSError):
                continue
            threading.Thread(target=self._drip, args=(conn,), daemon=True).start()

    def _drip(self, conn: socket.socket) -> None:
        with self._lock:
            self._open.add(conn)
        try:
            conn.recv(65536)  # the request: whatever it asks, the answer is the same
            i = 0
            while not self._stop.wait(self.every):
                conn.sendall(ANSWER[i : i + 1] or b"0")
                i += 1
        except OSError:
            pass
        finally:
            with self._lock:
                self._open.discard(conn)
            conn.close()


@contextmanager
def drip_registry(every: float = 0.5) -> Iterator[DripRegistry]:
    made = DripRegistry(every)
    made.start()
    try:
        yield made
    finally:
        made.stop()
