"""`execwatch trace --json` as a user runs it, its records read as they come."""

from __future__ import annotations

import contextlib
import json
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from tests.support.runtime.runc import FOREIGN_BUSYBOX

EXECWATCH = Path(sys.executable).parent / "execwatch"


class Trace:
    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process
        self.records: list[dict[str, Any]] = []
        self._lines: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with contextlib.suppress(json.JSONDecodeError):
                self._lines.put(json.loads(line))

    def drain(self) -> list[dict[str, Any]]:
        while True:
            try:
                self.records.append(self._lines.get_nowait())
            except queue.Empty:
                return self.records

    def mark(self) -> int:
        return len(self.drain())

    def wait_for(
        self, match: Mapping[str, Any], timeout: float = 20, since: int = 0
    ) -> dict[str, Any]:
        """The first record from the `since`-th on whose fields equal `match`'s."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for record in self.drain()[since:]:
                if all(record.get(k) == v for k, v in match.items()):
                    return record
            time.sleep(0.05)
        raise AssertionError(f"execwatch trace printed no record with {match}: {self.records}")

    def wait_attached(self, timeout: float = 60) -> None:
        """A host-side canary (the arm64 busybox run on the host) tells the probe is on; run
        again, that every record of what came before it was printed."""
        since = self.mark()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                subprocess.run([str(FOREIGN_BUSYBOX), "true"], check=False)
            with contextlib.suppress(AssertionError):
                self.wait_for({"path": str(FOREIGN_BUSYBOX)}, timeout=0.5, since=since)
                return
        raise AssertionError("execwatch trace never reported the canary")


@contextlib.contextmanager
def running_trace(env: Mapping[str, str], log: Path) -> Iterator[Trace]:
    with open(log, "ab") as err:
        process = subprocess.Popen(
            [str(EXECWATCH), "trace", "--json", "--duration", "600"],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env=dict(env),
        )
    trace = Trace(process)
    try:
        trace.wait_attached()
        yield trace
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
