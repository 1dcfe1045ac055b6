"""An `execwatch` command in its own process: killed, frozen or restarted like a pod."""

from __future__ import annotations

import signal
import subprocess
import sys
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.support.kube.apiserver import free_port


class ExecwatchProcess:
    """`python -m execwatch.cli ARGS --metrics-address 127.0.0.1:PORT`, logging to `log`."""

    def __init__(self, args: Sequence[str], log: Path, **popen: Any) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log = log
        argv = [sys.executable, "-m", "execwatch.cli", *args, "--metrics-address", self.address]
        with log.open("wb") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, **popen)

    def metrics_text(self) -> str:
        with urllib.request.urlopen(f"http://{self.address}/metrics", timeout=5) as r:
            text: str = r.read().decode()
        return text

    def metric(self, name: str, **labels: str) -> float:
        """The sum of the samples of `name` whose labels include `labels`."""
        return sum(
            s.value
            for family in text_string_to_metric_families(self.metrics_text())
            for s in family.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        )

    def serving(self) -> bool:
        try:
            self.metrics_text()
        except OSError:
            return False
        return True

    def stop(self) -> None:
        """SIGTERM (after SIGCONT, in case a test froze it), then SIGKILL after 15 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
