"""Peak memory of `execwatch agent`, against the agent before it left the official client.

    .venv/bin/python -m benchmarks.agent_memory [--failures 200] [--baseline-rev REV]

A real kube-apiserver + etcd (tests/kube). Each agent runs as its own process with the
agent ServiceAccount's token and the real BPF probe (root); `--failures` different arm64
binaries then fail to exec on this host, one after the other, and the agent publishes
them. Measured: the process's peak RSS (VmHWM) once every failure is published.

Runs, in one session, the same way:
- `runtime`: the default (`--pod-metadata runtime`: no pod watch), spool on disk;
- `api`: with the node-scoped pod watch (`--pod-metadata api`);
- `baseline`, only with `--baseline-rev REV`: the agent of an older revision, exported
  with `git archive`, its BPF object built with `make bpf`, default flags: how a change
  moves the figure (a commit cites it; the docs give the present figures).

Results are printed and saved to .cache/bench/agent_memory.json.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from tests.support.kube.apiserver import MANIFESTS, KubeCluster, load_manifests, running_cluster
from tests.support.kube.apiserver_fixtures import AGENT_SA
from tests.support.kube.execwatch_process import ExecwatchProcess

from benchmarks.common import require_root, rss_mb, save

REPO = Path(__file__).resolve().parent.parent
BUSYBOX = REPO / ".cache" / "foreign" / "arm64" / "root" / "usr" / "bin" / "busybox"


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"agent_memory: timed out waiting for {what}")


def baseline_tree(rev: str, work: Path) -> Path:
    tree = work / "baseline"
    tree.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", rev], check=True, capture_output=True
    )
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    subprocess.run(["make", "-C", str(tree), "bpf"], check=True, capture_output=True)
    return tree


def measure(label: str, args: list[str], env: dict[str, str], work: Path, failures: int) -> float:
    agent = ExecwatchProcess(args, work / f"{label}.log", env=env)
    try:
        wait_for(lambda: "execwatch_kernel_exec_failures" in agent.metrics_text(), 90, label)
        time.sleep(1)
        binaries = []
        for _ in range(failures):
            path = work / "bin" / f"{label}-{uuid.uuid4().hex[:10]}"
            shutil.copy(BUSYBOX, path)
            binaries.append(path)
        for path in binaries:
            with contextlib.suppress(OSError):  # "Exec format error": the failure we want
                subprocess.run([str(path)], check=False)
        wait_for(
            lambda: agent.metric("execwatch_publisher_published_failures_total") >= failures,
            120,
            f"{label}: {failures} failures published",
        )
        time.sleep(2)
        return rss_mb(agent.proc.pid)[1]
    finally:
        agent.stop()


def run(kube: KubeCluster, work: Path, failures: int, rev: str) -> dict[str, Any]:
    kubeconfig = kube.kubeconfig(kube.node_token(*AGENT_SA, "bench-node"), work / "agent.kc")
    common = ["agent", "--kubeconfig", str(kubeconfig), "--node", "bench-node"]
    (work / "bin").mkdir()
    env = dict(os.environ)
    runtime = measure("runtime", [*common, "--spool-dir", str(work / "spool")], env, work, failures)
    kube.apply(load_manifests(MANIFESTS / "optional"))
    api = measure(
        "api",
        [*common, "--spool-dir", str(work / "spool"), "--pod-metadata", "api"],
        env,
        work,
        failures,
    )
    result: dict[str, Any] = {
        "failures": failures,
        "agent_peak_rss_mb": round(runtime, 1),
        "agent_pod_watch_peak_rss_mb": round(api, 1),
    }
    if rev:
        tree = baseline_tree(rev, work)
        old_env = {**env, "PYTHONPATH": str(tree / "src")}
        baseline = measure("baseline", common, old_env, work, failures)
        result |= {"baseline_rev": rev, "baseline_peak_rss_mb": round(baseline, 1)}
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="benchmarks.agent_memory",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--failures", type=int, default=200)
    parser.add_argument("--baseline-rev", default="", metavar="REV")
    args = parser.parse_args(argv)
    require_root()
    with tempfile.TemporaryDirectory(prefix="execwatch-agent-mem-") as tmp:
        work = Path(tmp)
        with running_cluster(work / "kube") as kube:
            kube.apply(load_manifests())
            result = run(kube, work, args.failures, args.baseline_rev)
    for key, value in result.items():
        print(f"{key:32} {value}")
    print(f"saved {save('agent_memory', result)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
