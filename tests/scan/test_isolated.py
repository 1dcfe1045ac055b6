"""Scan work runs in a child process that is stopped by its limits, whatever the input
made the code do: the result, or what it raised, comes back; a kill is one line."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from execwatch.scan.errors import LimitExceeded
from execwatch.scan.isolated import MiB, ProcessLimits, ScanKilled, run_isolated, start_isolated
from tests.scan.test_report_escaping import long_named_rootfs

SMALL = ProcessLimits(memory=64 * MiB, cpu_s=60, wall_s=30)


def allocate_without_bound() -> None:
    hoard = []
    while True:
        hoard.append(bytearray(1 << 20))


def spin() -> None:
    while True:
        pass


def test_the_result_comes_back_from_the_child() -> None:
    parent = os.getpid()
    assert run_isolated(lambda: (os.getpid() != parent, [1, 2]), SMALL, "t") == (True, [1, 2])


def test_what_the_scan_raises_is_raised_here() -> None:
    def refuse() -> None:
        raise LimitExceeded("image: more than 1024 layers")

    with pytest.raises(LimitExceeded, match="more than 1024 layers"):
        run_isolated(refuse, SMALL, "t")


def test_memory_past_the_limit_stops_the_child_not_this_process() -> None:
    before = _rss()
    with pytest.raises(ScanKilled, match=r"x: over its memory budget \(64 MiB\)"):
        run_isolated(allocate_without_bound, SMALL, "x")
    assert _rss() - before < 32 * MiB


def test_a_child_past_its_wall_time_is_killed() -> None:
    started = time.monotonic()
    with pytest.raises(ScanKilled, match=r"x: killed after 0.5 s"):
        run_isolated(spin, ProcessLimits(wall_s=0.5), "x")
    assert time.monotonic() - started < 5


def test_a_child_past_its_cpu_time_is_killed_by_the_kernel() -> None:
    with pytest.raises(ScanKilled, match=r"over its CPU budget"):
        run_isolated(spin, ProcessLimits(cpu_s=1), "x")


def test_a_child_that_dies_without_a_result_is_one_line() -> None:
    with pytest.raises(ScanKilled, match="exited 5 with no result"):
        run_isolated(lambda: os._exit(5), SMALL, "x")
    with pytest.raises(ScanKilled, match=r"killed \(SIGKILL\)"):
        run_isolated(lambda: os.kill(os.getpid(), 9), SMALL, "x")


def test_a_started_child_works_while_the_caller_goes_on() -> None:
    """The static scan runs while --run unpacks: both take their time at once."""

    def static_scan() -> str:
        time.sleep(1.0)
        return "static"

    started = time.monotonic()
    pending = start_isolated(static_scan, SMALL, "t")
    assert time.monotonic() - started < 0.5
    time.sleep(1.0)  # the caller's own work, meanwhile
    assert pending.result() == "static"
    assert time.monotonic() - started < 1.8


def test_a_cancelled_child_is_killed_and_reaped() -> None:
    pending = start_isolated(spin, SMALL, "x")
    pending.cancel()
    assert pending.status is not None and os.WTERMSIG(pending.status) == 9
    with pytest.raises(ChildProcessError):
        os.waitpid(pending.pid, os.WNOHANG)


def test_the_wall_time_counts_from_the_start_not_from_the_wait() -> None:
    pending = start_isolated(spin, ProcessLimits(wall_s=0.5), "x")
    time.sleep(0.6)
    waited = time.monotonic()
    with pytest.raises(ScanKilled, match=r"x: killed after 0.5 s"):
        pending.result()
    assert time.monotonic() - waited < 0.3


def test_the_cli_stops_a_scan_over_its_memory_with_exit_2(tmp_path: Path) -> None:
    """200 members with 400 KiB names need about 200 MiB: under --max-memory 64M the scan's
    own process stops, the CLI says so in one line and exits 2."""
    target = long_named_rootfs(tmp_path / "big.tgz", 200)
    done = subprocess.run(
        [sys.executable, "-m", "execwatch.cli", "scan", "--no-progress", "--format", "json",
         "--max-memory", "64M", str(target)],
        capture_output=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stdout == b""
    [line] = done.stderr.decode().splitlines()
    assert line.startswith("execwatch scan: error: ") and "memory budget (64 MiB)" in line


def _rss() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0
