"""Small helpers the benchmarks share."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE.parent / ".cache" / "bench"


def build_c(source: str, out_dir: Path) -> Path:
    binary = out_dir / Path(source).stem
    subprocess.run(["gcc", "-O2", "-o", binary, HERE / source], check=True)
    return binary


@contextmanager
def sysctl(name: str, value: str) -> Iterator[None]:
    path = Path("/proc/sys") / name.replace(".", "/")
    old = path.read_text().strip()
    path.write_text(value)
    try:
        yield
    finally:
        path.write_text(old)


def rss_mb(pid: int | str = "self") -> tuple[float, float]:
    """(current RSS, peak RSS) in MB from /proc/PID/status."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return fields["VmRSS"], fields["VmHWM"]


def save(name: str, result: dict[str, object]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path


def require_root() -> None:
    if os.geteuid() != 0:
        sys.exit("this benchmark loads BPF programs: run it as root")


@contextmanager
def peak_while(read: Callable[[], float], interval: float) -> Iterator[list[float]]:
    """The largest value `read()` returns, called every `interval` seconds from a thread
    until the block ends, or until it raises OSError or ValueError (what it reads is
    gone): the list's one value."""
    peak = [0.0]
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            try:
                peak[0] = max(peak[0], read())
            except (OSError, ValueError):
                return
            stop.wait(interval)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield peak
    finally:
        stop.set()
        thread.join()
