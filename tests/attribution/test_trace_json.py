"""End to end: `execwatch trace --json` names the pod of a container that died at once."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tests.support.runtime.containerd import APP_IMAGE, Containerd
from tests.support.runtime.runc import FOREIGN_BUSYBOX

EXECWATCH = Path(sys.executable).parent / "execwatch"


def read_lines(stream: Any, out: queue.Queue[dict[str, Any]]) -> None:
    for line in stream:
        try:
            out.put(json.loads(line))
        except json.JSONDecodeError:
            continue


def wait_line(lines: queue.Queue[dict[str, Any]], path: str, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"execwatch trace printed no failure for {path}")
        try:
            record = lines.get(timeout=remaining)
        except queue.Empty:
            continue
        if record.get("path") == path:
            return record


def test_trace_json_carries_pod_container_image_and_workload(containerd: Containerd) -> None:
    env = {**os.environ, "EXECWATCH_CRI_SOCKETS": str(containerd.socket)}
    trace = subprocess.Popen(
        [str(EXECWATCH), "trace", "--json", "--duration", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    lines: queue.Queue[dict[str, Any]] = queue.Queue()
    threading.Thread(target=read_lines, args=(trace.stdout, lines), daemon=True).start()
    pod = None
    try:
        deadline = time.monotonic() + 30
        while True:  # a host-side canary tells when the probe is attached
            assert time.monotonic() < deadline, "execwatch trace never reported the canary"
            with contextlib.suppress(OSError):
                subprocess.run([str(FOREIGN_BUSYBOX), "true"], check=False)
            try:
                canary = wait_line(lines, str(FOREIGN_BUSYBOX), timeout=0.5)
                break
            except AssertionError:
                continue
        assert canary["attribution"] == "host"

        pod = containerd.run_pod(
            "api-6f7c9d8b4-q8w2e", namespace="prod", labels={"pod-template-hash": "6f7c9d8b4"}
        )
        foreign = containerd.foreign_path(pod)
        cid = containerd.create_container(pod, "server", [foreign, "--help"])
        record = wait_line(lines, foreign, timeout=20)

        assert record["errno"] == "ENOEXEC"
        assert record["attribution"] == "attributed"
        assert record["container_id"] == cid
        assert record["pod_uid"] == pod.uid
        assert (record["namespace"], record["pod"], record["container"]) == (
            "prod",
            "api-6f7c9d8b4-q8w2e",
            "server",
        )
        assert record["image"] == APP_IMAGE
        assert (record["workload_kind"], record["workload"]) == ("Deployment", "api")
        assert record["runtime"] == "containerd"
    finally:
        trace.send_signal(signal.SIGINT)
        try:
            trace.wait(timeout=15)
        except subprocess.TimeoutExpired:
            trace.kill()
            trace.wait()
        if pod is not None:
            containerd.remove_pod(pod)
