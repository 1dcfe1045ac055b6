"""execwatch on one real node (tests/node): install time, detection latency, resource use.

    .venv/bin/python -m benchmarks.node_bench            # ~6 min, root; needs dev/setup.sh --test

1. install: `helm install` (chart defaults + the CRI socket) until the agent and both
   handler replicas are Ready;
2. latency: pods whose entrypoint is an arm64 binary, one after the other; for each, the
   time from the failed exec (the Event's eventTime is the kernel's timestamp of it) and
   from the pod's creation to the moment a watch sees execwatch's Warning Event;
3. resources: the agent's and the handler leader's CPU and memory as the kubelet measures
   them (its Summary API, /stats/summary: the containers' cgroups), idle, then while a
   Deployment of 20 pods crash-loops on that arm64 entrypoint.

Results land in .cache/bench/node.json. The machine is shared: figures are noisy.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

from kubernetes import client, watch
from tests.support.kubenode.helm_install import NAMESPACE, helm_install, wait_quota_counted
from tests.support.kubenode.kubelet_node import NODE_NAME, Node, running_node, wait_for
from tests.support.kubenode.node_images import (
    WEB_V2_ARM64,
    build_workloads,
    require_execwatch_archive,
)
from tests.support.kubenode.story_workloads import (
    HANDLER_COMPONENT,
    container,
    deployment,
    ensure_namespace,
    pods,
    restarts,
)

from benchmarks.common import require_root, save

NS = "bench"


def summary(node: Node) -> dict[str, Any]:
    """The kubelet's Summary API, through the API server's node proxy."""
    resp = node.core().connect_get_node_proxy_with_path(
        NODE_NAME, "stats/summary", _preload_content=False
    )
    data: dict[str, Any] = json.loads(resp.data)
    return data


def containers(node: Node) -> dict[str, dict[str, Any]]:
    """pod name -> the execwatch container's stats (cpu usageCoreNanoSeconds, memory)."""
    out = {}
    for pod in summary(node).get("pods", []):
        ref = pod["podRef"]
        if ref["namespace"] != NAMESPACE:
            continue
        for c in pod.get("containers", []):
            if c["name"] in ("agent", "handler"):
                out[ref["name"]] = {"name": c["name"], **c}
    return out


def leader(node: Node) -> str:
    lease = client.CoordinationV1Api(node.client()).read_namespaced_lease(
        "execwatch-handler", NAMESPACE
    )
    return str(lease.spec.holder_identity).split("_")[0]  # <pod name>_<suffix>


def sample_resources(node: Node, seconds: float, every: float = 5.0) -> dict[str, Any]:
    """Mean CPU (cores) over `seconds`, and memory (working set, RSS) mean and max."""
    lead = leader(node)
    first = containers(node)
    t0 = time.monotonic()
    mem: dict[str, list[tuple[float, float]]] = {}
    last = first
    while time.monotonic() - t0 < seconds:
        time.sleep(every)
        last = containers(node)
        for pod, c in last.items():
            m = c.get("memory", {})
            mem.setdefault(pod, []).append(
                (m.get("workingSetBytes", 0) / 2**20, m.get("rssBytes", 0) / 2**20)
            )
    elapsed = time.monotonic() - t0
    result = {}
    for pod, c in last.items():
        role = c["name"] if c["name"] == "agent" else ("leader" if pod == lead else "standby")
        before = first.get(pod, {}).get("cpu", {}).get("usageCoreNanoSeconds")
        after = c.get("cpu", {}).get("usageCoreNanoSeconds")
        cpu = (after - before) / 1e9 / elapsed if before is not None and after else None
        ws = [w for w, _ in mem.get(pod, [])]
        rss = [r for _, r in mem.get(pod, [])]
        result[role] = {
            "cpu_cores_mean": round(cpu, 4) if cpu is not None else None,
            "working_set_mb_mean": round(statistics.mean(ws), 1) if ws else None,
            "working_set_mb_max": round(max(ws), 1) if ws else None,
            "rss_mb_mean": round(statistics.mean(rss), 1) if rss else None,
            "rss_mb_max": round(max(rss), 1) if rss else None,
        }
    return {"seconds": round(elapsed, 1), **result}


class EventWatch:
    """A watch on execwatch's Warning Events in NS: pod name -> (Event, local time seen)."""

    def __init__(self, node: Node) -> None:
        self.seen: dict[str, tuple[Any, float]] = {}
        self._watch = watch.Watch()
        self._api = client.CoreV1Api(node.client())
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for item in self._watch.stream(
            self._api.list_namespaced_event,
            NS,
            field_selector=f"type=Warning,reportingComponent={HANDLER_COMPONENT}",
            timeout_seconds=0,
        ):
            ev = item["object"]
            self.seen.setdefault(ev.involved_object.name, (ev, time.time()))

    def stop(self) -> None:
        self._watch.stop()  # the stream may end with a ProtocolError in its thread: harmless


def bench_latency(node: Node, count: int) -> dict[str, Any]:
    core = node.core()
    events = EventWatch(node)
    from_exec, from_create = [], []
    try:
        for i in range(count):
            name = f"lat-{i}"
            pod = client.V1Pod(
                metadata=client.V1ObjectMeta(name=name, namespace=NS),
                spec=client.V1PodSpec(
                    containers=[container("app", WEB_V2_ARM64)], restart_policy="Never"
                ),
            )
            created = time.time()
            core.create_namespaced_pod(NS, pod)
            ev, seen = wait_for(f"Event for {name}", partial(events.seen.get, name), 60, 0.02)
            from_exec.append(seen - ev.event_time.timestamp())
            from_create.append(seen - created)
            core.delete_namespaced_pod(name, NS, grace_period_seconds=0)
    finally:
        events.stop()
    return {
        "pods": count,
        "failed_exec_to_event_s": _dist(from_exec),
        "pod_created_to_event_s": _dist(from_create),
    }


def _dist(values: list[float]) -> dict[str, float]:
    values = sorted(values)
    return {
        "p50": round(statistics.median(values), 3),
        "p90": round(values[int(0.9 * (len(values) - 1))], 3),
        "max": round(values[-1], 3),
    }


def bench_crash_loop(node: Node, replicas: int, seconds: float) -> dict[str, Any]:
    apps = client.AppsV1Api(node.client())
    apps.create_namespaced_deployment(NS, deployment("crash", NS, WEB_V2_ARM64, replicas))
    wait_for(
        f"{replicas} crash-looping pods",
        lambda: len([p for p in pods(node, NS, "app=crash") if restarts(p) >= 1]) >= replicas,
        240,
        every=2,
    )
    result = sample_resources(node, seconds)
    result["restarts_at_end"] = sum(restarts(p) for p in pods(node, NS, "app=crash"))
    apps.delete_namespaced_deployment("crash", NS)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="benchmarks.node_bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--latency-pods", type=int, default=10)
    parser.add_argument("--idle-seconds", type=float, default=60)
    parser.add_argument("--crash-pods", type=int, default=20)
    parser.add_argument("--crash-seconds", type=float, default=120)
    args = parser.parse_args(argv)
    require_root()
    results: dict[str, Any] = {}
    archive = require_execwatch_archive()
    with running_node() as node:
        results["node_ready_s"] = round(node.ready_after, 1)
        node.import_image(archive)
        for workload in build_workloads(Path(node.workdir) / "workloads"):
            node.import_image(workload)
        release = helm_install(node)
        results["install_to_ready_s"] = round(release.seconds_to_ready, 1)
        print(json.dumps(results), flush=True)
        ensure_namespace(node, NS)
        # Steady state: records wait until the controller-manager counts the records
        # quota, up to its 5-minute resync after a fresh install (docs/install.md).
        wait_quota_counted(node)
        time.sleep(20)  # let start-up work settle before "idle"
        results["idle"] = sample_resources(node, args.idle_seconds)
        print(json.dumps(results["idle"]), flush=True)
        results["latency"] = bench_latency(node, args.latency_pods)
        print(json.dumps(results["latency"]), flush=True)
        results["crash_loop"] = bench_crash_loop(node, args.crash_pods, args.crash_seconds)
        print(json.dumps(results["crash_loop"]), flush=True)
    path = save("node", results)
    print(f"saved {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
