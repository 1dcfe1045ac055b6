"""The metrics/healthz server of agent and handler holds up against idle connections.

Any pod that can reach the port may open connections and send nothing. The server runs in
its own process here (the real `execwatch.node.metrics.serve`), so its threads and RSS are read
from /proc exactly as a node would see them.
"""

from __future__ import annotations

import gzip
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, closing
from dataclasses import dataclass
from pathlib import Path

import pytest

SERVER = """
import sys
from prometheus_client import CollectorRegistry, Counter
from execwatch.serving.exposition import serve
from execwatch.serving.http import ServerLimits

registry = CollectorRegistry()
Counter("execwatch_probe_check", "a sample", registry=registry).inc()
limits = ServerLimits(max_connections=int(sys.argv[1]), read_timeout=float(sys.argv[2]))
server = serve(("127.0.0.1", 0), registry, lambda: None, limits)
print(server.server_port, flush=True)
sys.stdin.read()
server.shutdown()
"""


@dataclass
class Server:
    proc: subprocess.Popen[str]
    port: int

    def status(self, field: str) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
        raise AssertionError(f"{field} not in /proc/{self.proc.pid}/status")

    def get(self, path: str, timeout: float = 1.0) -> tuple[int, bytes]:
        url = f"http://127.0.0.1:{self.port}{path}"
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()

    def dropped(self, kind: str) -> float:
        for line in self.get("/metrics")[1].decode().splitlines():
            if line.startswith(f'execwatch_metrics_connections_dropped_total{{type="{kind}"}}'):
                return float(line.split()[-1])
        return 0.0


def start(max_connections: int = 32, read_timeout: float = 5.0) -> Server:
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(max_connections), str(read_timeout)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    return Server(proc, int(proc.stdout.readline()))


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[Server]:
    s = start(*getattr(request, "param", ()))
    yield s
    assert s.proc.stdin is not None
    s.proc.stdin.close()
    assert s.proc.wait(timeout=10) == 0


def idle_connections(stack: ExitStack, port: int, n: int) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        s = stack.enter_context(closing(socket.create_connection(("127.0.0.1", port))))
        socks.append(s)
    return socks


def closed_by_server(s: socket.socket) -> bool:
    """The server closed `s`: end of file, or a reset if it left our bytes unread."""
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


def test_a_thousand_idle_connections_cost_no_thread_and_little_memory(server: Server) -> None:
    server.get("/metrics")  # everything a scrape touches is loaded
    threads, rss_kib = server.status("Threads"), server.status("VmRSS")
    with ExitStack() as stack:
        idle_connections(stack, server.port, 1000)
        time.sleep(0.5)  # the server has accepted (and closed) what it will
        assert server.status("Threads") == threads
        assert server.status("VmRSS") - rss_kib < 4096
        started = time.monotonic()
        status, body = server.get("/metrics", timeout=1.0)
        assert status == 200 and b"execwatch_probe_check_total 1.0" in body
        assert time.monotonic() - started < 1.0
        assert server.get("/healthz")[1] == b"ok\n"
    assert server.dropped("over_cap") >= 1000 - 32


@pytest.mark.parametrize("server", [(32, 0.5)], indirect=True)
def test_an_idle_connection_is_closed_after_the_read_timeout(server: Server) -> None:
    with closing(socket.create_connection(("127.0.0.1", server.port))) as s:
        s.settimeout(5.0)
        s.sendall(b"GET /metrics HTTP/1.1\r\n")  # and never the end of the headers
        started = time.monotonic()
        assert closed_by_server(s)
        assert 0.3 < time.monotonic() - started < 3.0
    assert server.dropped("timeout") == 1


@pytest.mark.parametrize("server", [(4, 5.0)], indirect=True)
def test_over_the_cap_the_oldest_waiting_connection_is_closed_at_once(server: Server) -> None:
    with ExitStack() as stack:
        first, *_others = idle_connections(stack, server.port, 4)
        newest = idle_connections(stack, server.port, 1)[0]
        first.settimeout(1.0)
        assert closed_by_server(first)  # evicted at once, long before its 5 s
        newest.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        newest.settimeout(1.0)
        assert newest.recv(64).startswith(b"HTTP/1.1 200 OK")
    assert server.dropped("over_cap") == 1


@pytest.mark.parametrize("server", [(4, 5.0)], indirect=True)
def test_a_flood_from_one_address_evicts_its_own_connections_first(server: Server) -> None:
    """The kubelet's probe (the node's address) outlives a flood from a pod's address."""
    with ExitStack() as stack:
        probe = stack.enter_context(closing(socket.socket()))
        probe.bind(("127.0.0.2", 0))
        probe.connect(("127.0.0.1", server.port))
        time.sleep(0.1)  # accepted first: the oldest
        idle_connections(stack, server.port, 100)
        time.sleep(0.2)
        probe.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        probe.settimeout(1.0)
        assert probe.recv(64).startswith(b"HTTP/1.1 200 OK")
    assert server.dropped("over_cap") >= 100 - 3


def test_an_oversized_request_is_dropped(server: Server) -> None:
    with closing(socket.create_connection(("127.0.0.1", server.port))) as s:
        s.settimeout(5.0)
        s.sendall(b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 20000)
        assert closed_by_server(s)
    assert server.dropped("oversize") == 1


def test_scrapes_are_answered_as_prometheus_asks(server: Server) -> None:
    url = f"http://127.0.0.1:{server.port}/metrics"
    req = urllib.request.Request(
        url,
        headers={
            "Accept": "application/openmetrics-text; version=1.0.0",
            "Accept-Encoding": "gzip",
        },
    )
    with urllib.request.urlopen(req, timeout=1.0) as resp:
        assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
        assert resp.headers["Content-Encoding"] == "gzip"
        assert gzip.decompress(resp.read()).endswith(b"# EOF\n")
    with closing(socket.create_connection(("127.0.0.1", server.port))) as s:
        s.sendall(b"garbage\r\n\r\n")
        assert s.recv(64).startswith(b"HTTP/1.1 400 ")
