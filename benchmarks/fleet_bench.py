"""A bad rollout on a simulated fleet: KWOK nodes on a real control plane (tests/fleet/kwok.py).

    .venv/bin/python -m benchmarks.fleet_bench [--nodes 1000] [--burst-nodes 300]
        [--burst-seconds 10] [--crash-seconds 300] [--crash-every 10] [--crash-window 60]

The fleet: `--nodes` kwok nodes, 30 % arm64, the agent DaemonSet on every node, and a
Deployment `bad` with one pod on each of `--burst-nodes` arm64 nodes. An `execwatch
handler` process runs as the handler's ServiceAccount. Every arm64 node's agent is the
real publisher with a token minted through TokenRequest for the agent pod on that node,
so every record goes through the node-binding admission policy.

- burst: each `bad` pod fails once (ForeignArchitecture), the failures spread evenly
  over `--burst-seconds`. Latency = when a watch on the namespace sees the pod's Warning
  Event minus when the failure was handed to that node's publisher: p50, p99, max.
- crash loop: every pod then fails again every `--crash-every` seconds for
  `--crash-seconds` (aggregation window `--crash-window`). API writes of the pipeline
  (records, Events, pod labels) counted by the API server itself, per failure.
- throughout: the API server's request rate (all clients: kwok's heartbeats included),
  the handler's CPU seconds and RSS, and exact counts (the handler's
  execwatch_exec_failures_total against the failures caused; creates answered 409 by
  the ResourceQuota admission when it lost a race for the quota object, which created
  nothing and are retried, are counted as `quota_409_retried`).

Results are printed and saved to .cache/bench/fleet.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client, watch
from tests.cluster.records import CountingRecords, exec_failure
from tests.fleet.kwok import ARCH_LABEL, FLEET_LABEL, TOLERATION, Fleet, fleet_cluster
from tests.kube.fixtures import HANDLER_SA
from tests.kube.processes import ExecwatchProcess

from benchmarks.cluster_bench import (
    apiserver_requests,
    diff,
    handler_args,
    lease_holder,
    percentile,
    records_left,
    start_execwatch,
    wait_for,
)
from benchmarks.common import RESULTS, rss_mb, save
from execwatch.cluster import crd
from execwatch.cluster.publisher import Publisher, PublisherConfig

NAMESPACE = "rollout"
WORKLOAD = "bad"
PIPELINE = ("execfailures", "events", "pods")  # pods: the handler's label patches


def bad_deployment(replicas: int) -> dict[str, Any]:
    labels = {"app": WORKLOAD}
    return {
        "metadata": {"name": WORKLOAD},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "tolerations": [TOLERATION],
                    "nodeSelector": {FLEET_LABEL: "true", ARCH_LABEL: "arm64"},
                    "topologySpreadConstraints": [
                        {
                            "maxSkew": 1,
                            "topologyKey": "kubernetes.io/hostname",
                            "whenUnsatisfiable": "DoNotSchedule",
                            "labelSelector": {"matchLabels": labels},
                        }
                    ],
                    "containers": [{"name": "app", "image": "registry.example/bad:1"}],
                },
            },
        },
    }


@dataclass
class NodeAgent:
    node: str
    pod: dict[str, Any]  # the `bad` pod on this node
    api: Any
    publisher: Publisher
    sink: CountingRecords


@dataclass
class EventClock:
    """When a watch on the namespace first saw each pod's Warning Event."""

    fleet: Fleet
    seen: dict[str, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        # core/v1's view of the handler's events.k8s.io Events: the scheduler's and the
        # controllers' Events there carry no eventTime, which events.k8s.io's model refuses.
        with self.fleet.cluster.client() as api:
            core = client.CoreV1Api(api)
            while not self.stop.is_set():
                w = watch.Watch()
                try:
                    for item in w.stream(
                        core.list_namespaced_event,
                        NAMESPACE,
                        field_selector="type=Warning",
                        timeout_seconds=5,
                        _request_timeout=30,
                    ):
                        self.seen.setdefault(item["object"].involved_object.name, time.time())
                        if self.stop.is_set():
                            w.stop()
                except Exception as exc:  # a loaded API server: watch again (lists first)
                    self.errors.append(repr(exc)[:200])
                    time.sleep(0.2)


@contextmanager
def event_clock(fleet: Fleet) -> Iterator[EventClock]:
    clock = EventClock(fleet)
    t = threading.Thread(target=clock.run, daemon=True)
    t.start()
    try:
        yield clock
    finally:
        clock.stop.set()
        t.join(timeout=10)


def events_by_source(fleet: Fleet) -> dict[str, int]:
    """Every Event object in the cluster, by reporting component, reason and namespace."""
    with fleet.cluster.client() as api:
        events = client.CoreV1Api(api).list_event_for_all_namespaces().items
    out: dict[str, int] = {}
    for e in events:
        key = f"{e.reporting_component or e.source.component}/{e.reason} in {e.metadata.namespace}"
        out[key] = out.get(key, 0) + int(e.series.count if e.series else e.count or 1)
    return dict(sorted(out.items(), key=lambda kv: -kv[1])[:12])


def worker_alive(publisher: Publisher) -> bool:
    thread = publisher._thread
    return thread is not None and thread.is_alive()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    ticks = 100.0  # USER_HZ
    return (int(fields[11]) + int(fields[12])) / ticks


def start_agents(
    fleet: Fleet, agents: dict[str, Any], pods: list[Any], window: float
) -> list[NodeAgent]:
    def one(pod: Any) -> NodeAgent:
        node = pod["spec"]["nodeName"]
        api = fleet.cluster.lightkube(fleet.agent_token(agents[node]))
        cfg = PublisherConfig(node=node, aggregation_window=window)
        sink = CountingRecords(api, crd.DEFAULT_NAMESPACE)
        publisher = Publisher(cfg, sink)
        publisher.start()
        return NodeAgent(node, pod, api, publisher, sink)

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, pods))


def pipeline_writes(fleet: Fleet) -> dict[str, float]:
    writes = apiserver_requests(fleet.cluster, ("POST", "PUT", "PATCH", "DELETE"))
    return {k: v for k, v in writes.items() if k.split(" ", 1)[1] in PIPELINE}


def all_requests(fleet: Fleet) -> float:
    return sum(apiserver_requests(fleet.cluster).values())


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    t0 = time.monotonic()
    with fleet_cluster(work / "fleet", args.nodes) as fleet:
        agents_by_node = fleet.deploy_agents(timeout=600)
        with fleet.cluster.client() as api:
            client.CoreV1Api(api).create_namespace({"metadata": {"name": NAMESPACE}})
            client.AppsV1Api(api).create_namespaced_deployment(
                NAMESPACE, bad_deployment(args.burst_nodes)
            )
            pods = [
                api.sanitize_for_serialization(p)
                for p in fleet.wait_running(NAMESPACE, f"app={WORKLOAD}", args.burst_nodes, 600)
            ]
        setup_s = time.monotonic() - t0
        print(f"fleet up in {setup_s:.0f} s: {args.nodes} nodes, {len(pods)} bad pods", flush=True)
        cluster = fleet.cluster
        handler_cfg = cluster.kubeconfig(
            cluster.service_account_token(*HANDLER_SA), work / "handler.kcfg"
        )
        handler = start_execwatch(handler_args(handler_cfg), work / "handler.log")
        agents = start_agents(fleet, agents_by_node, pods, args.crash_window)
        try:
            with cluster.client() as admin:
                wait_for(lambda: lease_holder(admin), 60, "handler lease")
            return measure(args, fleet, handler, agents) | {
                "nodes": args.nodes,
                "bad_pods": len(pods),
                "fleet_setup_s": round(setup_s, 1),
            }
        finally:
            for a in agents:
                a.publisher.stop(flush_timeout=0)
                a.api.close()
            handler.stop()
            shutil.copy(work / "handler.log", RESULTS / "fleet-handler.log")


def measure(
    args: argparse.Namespace, fleet: Fleet, handler: ExecwatchProcess, agents: list[NodeAgent]
) -> dict[str, Any]:
    pid = handler.proc.pid
    caused = 0
    submitted: dict[str, float] = {}
    requests0, cpu0, t0 = all_requests(fleet), cpu_seconds(pid), time.monotonic()
    with event_clock(fleet) as clock:
        gap = args.burst_seconds / len(agents)
        for a in agents:
            name = a.pod["metadata"]["name"]
            submitted[name] = time.time()
            a.publisher.submit(exec_failure(pod=a.pod, node_arch="arm64", binary_arch="amd64"))
            caused += 1
            time.sleep(gap)
        with contextlib.suppress(TimeoutError):  # reported as missing
            wait_for(lambda: len(clock.seen) >= len(agents), 180, "every pod's Event")
        burst_s = time.monotonic() - t0
        latencies = [clock.seen[n] - submitted[n] for n in submitted if n in clock.seen]
        missing = len(submitted) - len(latencies)
        latencies = latencies or [float("nan")]
        with fleet.cluster.client() as admin:
            left = records_left(admin)
    burst = {
        "seconds": round(burst_s, 1),
        "events_missing": missing,
        "records_left": left,
        "watch_errors": clock.errors[:5],
        "counted_by_handler": handler.metric("execwatch_exec_failures_total", namespace=NAMESPACE),
        "latency_p50_s": round(percentile(latencies, 50), 3),
        "latency_p99_s": round(percentile(latencies, 99), 3),
        "latency_max_s": round(max(latencies), 3),
        "apiserver_requests_per_s": round((all_requests(fleet) - requests0) / burst_s, 1),
        "handler_cpu_s": round(cpu_seconds(pid) - cpu0, 2),
    }
    print("burst", json.dumps(burst), flush=True)

    writes0, requests0, cpu0, t0 = (
        pipeline_writes(fleet),
        all_requests(fleet),
        cpu_seconds(pid),
        time.monotonic(),
    )
    crash_failures = 0
    while time.monotonic() - t0 < args.crash_seconds:
        tick = time.monotonic()
        for a in agents:
            a.publisher.submit(exec_failure(pod=a.pod, node_arch="arm64", binary_arch="amd64"))
            crash_failures += 1
        time.sleep(max(0.0, args.crash_every - (time.monotonic() - tick)))
    crash_s = time.monotonic() - t0
    # A publisher whose worker thread died (on an exception it does not handle) publishes
    # nothing more: what it held and what it is given after are lost.
    dead = sum(not worker_alive(a.publisher) for a in agents)
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda a: a.publisher.stop(flush_timeout=30), agents))
    caused += crash_failures
    with fleet.cluster.client() as admin:
        wait_for(lambda: records_left(admin) == 0, 300, "records handled")
    with contextlib.suppress(TimeoutError):  # a shortfall is reported as lost
        wait_for(
            lambda: handler.metric("execwatch_exec_failures_total", namespace=NAMESPACE) >= caused,
            30,
            "the handler's count",
        )
    time.sleep(1)
    writes = diff(pipeline_writes(fleet), writes0)
    rss, peak = rss_mb(pid)
    crash = {
        "seconds": round(crash_s, 1),
        "failures": crash_failures,
        "api_writes": writes,
        "writes_per_failure": round(sum(writes.values()) / crash_failures, 4),
        "apiserver_requests_per_s": round((all_requests(fleet) - requests0) / crash_s, 1),
        "handler_cpu_s": round(cpu_seconds(pid) - cpu0, 2),
    }
    print("crash", json.dumps(crash), flush=True)
    crash["events_by_source"] = events_by_source(fleet)
    counted = handler.metric("execwatch_exec_failures_total", namespace=NAMESPACE)
    return {
        "burst": burst,
        "crash": crash,
        "failures_caused": caused,
        "counted_by_handler": counted,
        "lost": caused - counted,
        "quota_409_retried": sum(a.sink.conflicts for a in agents),
        "publishers_dead": dead,
        "handler_rss_mb": round(rss, 1),
        "handler_peak_rss_mb": round(peak, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="benchmarks.fleet_bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--burst-nodes", type=int, default=300)
    parser.add_argument("--burst-seconds", type=float, default=10.0)
    parser.add_argument("--crash-seconds", type=float, default=300.0)
    parser.add_argument("--crash-every", type=float, default=10.0)
    parser.add_argument("--crash-window", type=float, default=60.0)
    args = parser.parse_args(argv)
    if args.burst_nodes > int(args.nodes * 0.3):
        parser.error(f"--burst-nodes: only {int(args.nodes * 0.3)} of {args.nodes} nodes are arm64")
    with tempfile.TemporaryDirectory(prefix="execwatch-fleet-bench-") as tmp:
        result = run(args, Path(tmp))
    print(json.dumps(result, indent=2))
    print(f"saved {save('fleet', result)}")
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    return 0


if __name__ == "__main__":
    sys.exit(main())
