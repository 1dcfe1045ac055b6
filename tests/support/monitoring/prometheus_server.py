"""A real Prometheus (Debian's `prometheus` binary) on loopback, for tests."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Prometheus:
    """Scrapes `targets` ({job: [host:port]}) every second; stop() ends the process.

    `config` replaces the generated configuration (scrape_configs, rule_files, ...);
    `binary` replaces Debian's prometheus (built without kubernetes_sd)."""

    def __init__(
        self,
        workdir: Path,
        targets: dict[str, list[str]] | None = None,
        config: dict[str, Any] | None = None,
        binary: str | None = None,
    ) -> None:
        binary = binary or shutil.which("prometheus")
        if binary is None:
            raise FileNotFoundError(
                "prometheus missing: apt-get install prometheus (dev/setup.sh --test)"
            )
        workdir.mkdir(parents=True, exist_ok=True)
        config = config or {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": addrs}]}
                for job, addrs in (targets or {}).items()
            ],
        }
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = workdir / "prometheus.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [
                    binary,
                    f"--config.file={workdir / 'prometheus.yml'}",
                    f"--storage.tsdb.path={workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--storage.tsdb.retention.time=1h",
                    "--log.level=warn",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()  # its own session: nothing else would ever stop it
            raise

    def _wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("prometheus exited:\n" + self.log.read_text())
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise TimeoutError("prometheus not ready:\n" + self.log.read_text())

    def query(self, promql: str) -> dict[str, Any]:
        """GET /api/v1/query; the `data` of a successful answer."""
        url = self.url + "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        data: dict[str, Any] = body["data"]
        return data

    def values(self, promql: str) -> list[float]:
        """The sample values of an instant query, as Argo Rollouts' `result` sees them."""
        data = self.query(promql)
        if data["resultType"] == "scalar":
            return [float(data["result"][1])]
        return [float(s["value"][1]) for s in data["result"]]

    def wait_until(self, promql: str, predicate: Any, timeout: float = 30.0) -> list[float]:
        deadline = time.monotonic() + timeout
        got: list[float] = []
        while time.monotonic() < deadline:
            got = self.values(promql)
            if predicate(got):
                return got
            time.sleep(0.5)
        raise AssertionError(f"{promql!r} never matched; last {got}")

    def get(self, path: str) -> Any:
        """GET an API path (/api/v1/alerts, /api/v1/targets); the answer's `data`."""
        with urllib.request.urlopen(self.url + path, timeout=10) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        return body["data"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
