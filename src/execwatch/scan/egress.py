"""Where the registry client's connections may go, and how long one resolution may hold them.

- `Egress`: the destinations a connection may reach. An address that is not global
  (loopback, link-local, private, shared, reserved) is refused unless an allowed network
  contains it. Every address the host name resolves to is checked before connecting (a
  refused destination is never probed), and the connection goes to a checked address
  itself: the name is not resolved again, so one that answers differently the second
  time gains nothing.
- `Deadline`: one resolution's hard deadline. Per-read socket timeouts restart with each
  byte, so a registry dripping a byte every half second holds a read for ever; past the
  deadline, every connection the resolution opened or used is shut down, which ends a
  blocked read or a TLS handshake at once, whatever the registry does; a connect is
  bounded by the time left.

Both reach the connections through a `Watch`: per Session, per thread, what the thread's
current request may do. `scan.guard.GuardedAdapter` makes every connection of a Session
obey it.
"""

from __future__ import annotations

import contextlib
import ipaddress
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class EgressRefused(Exception):
    """A connection to a destination the egress policy does not allow; never attempted."""

    def __init__(self, kind: str) -> None:
        super().__init__(f"a {kind} address")
        self.kind = kind


def parse_network(text: str) -> Network:
    """A CIDR or a single address (argparse type); ValueError when it is neither."""
    return ipaddress.ip_network(text.strip(), strict=False)


@dataclass(frozen=True)
class Egress:
    """Global addresses, and the non-global ones inside `allowed`."""

    allowed: tuple[Network, ...] = ()

    def refuses(self, address: str) -> str | None:
        """The kind of a refused address ('loopback', 'private', ...); None when allowed."""
        try:
            ip = ipaddress.ip_address(address.split("%", 1)[0])
        except ValueError:
            return "malformed"
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        if ip.is_global and not ip.is_multicast:
            return None
        if any(ip.version == net.version and ip in net for net in self.allowed):
            return None
        return _kind(ip)


def _kind(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local:
        return "link-local"
    if ip.is_multicast:
        return "multicast"
    if ip.is_unspecified:
        return "unspecified"
    return "private"


class Shuttable(Protocol):
    owner: Deadline | None

    def shut(self) -> None: ...


class Deadline:
    """Shuts down, once `seconds` have passed, the connections watched since it was armed."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds
        self.fired = False
        self._conns: list[Shuttable] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(max(0.0, seconds), self._fire)
        self._timer.daemon = True

    def left(self) -> float:
        return self.at - time.monotonic()

    @contextlib.contextmanager
    def armed(self) -> Iterator[Deadline]:
        self._timer.start()
        try:
            yield self
        finally:
            self._timer.cancel()
            with self._lock:
                self._conns.clear()

    def watch(self, conn: Shuttable) -> None:
        with self._lock:
            conn.owner = self
            if self.fired:
                conn.shut()
            else:
                self._conns.append(conn)

    def _fire(self) -> None:
        with self._lock:
            self.fired = True
            conns, self._conns = self._conns, []
        for conn in conns:
            if conn.owner is self:
                conn.shut()


class Watch(threading.local):
    """What the current request of this thread may do, over one Session."""

    def __init__(self) -> None:
        self.deadline: Deadline | None = None
        self.egress: Egress | None = None  # None: any destination (the command line's scans)

    @contextlib.contextmanager
    def applying(self, deadline: Deadline | None, egress: Egress | None) -> Iterator[None]:
        before = (self.deadline, self.egress)
        self.deadline, self.egress = deadline, egress
        try:
            yield
        finally:
            self.deadline, self.egress = before
