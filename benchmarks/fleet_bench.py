"""A bad rollout on a simulated fleet: KWOK nodes on a real control plane
(tests/support/kube/kwok.py).

    .venv/bin/python -m benchmarks.fleet_bench [--nodes 1000] [--pods 10000]
        [--burst-nodes 300] [--burst-seconds 10] [--crash-seconds 300] [--crash-every 10]
        [--crash-window 60] [--crash-window-max 300] [--crash-steady 0] [--crash-warmup 430]

The fleet: `--nodes` kwok nodes, 30 % arm64, the agent DaemonSet on every node, a
Deployment `bad` with one pod on each of `--burst-nodes` arm64 nodes, and Deployments in
the namespace `fleet` that bring the cluster to `--pods` Running pods. Two `execwatch
handler` processes (`fleet-a`, `fleet-b`, the chart's Lease timing) run as the handler's
ServiceAccount. Every arm64 node's agent is the real publisher with a token minted through
TokenRequest for the agent pod on that node, so every record goes through the
node-binding admission policy.

- start-up: a record waits (a failure of the agent pod on the first node) when `fleet-a`
  starts: seconds from its process start to the Lease held and to that record counted,
  and its RSS then. `fleet-b` starts next, the standby.
- burst: each `bad` pod fails once (ForeignArchitecture), the failures spread evenly
  over `--burst-seconds`. When half of them have been handed to their publishers, the
  leader is stopped (SIGTERM, as a rollout of the handler does): seconds until it exited
  and until the standby held the Lease. Latency = when a watch on the namespace sees the
  pod's Warning Event minus when the failure was handed to that node's publisher.
- crash loop: every pod then fails again every `--crash-every` seconds (the key of its
  burst failure: the burst is the loop's first failure), handled by the new leader. Each
  key's aggregation window starts at `--crash-window` and doubles while the key repeats,
  up to `--crash-window-max` (at or below `--crash-window`: fixed). API writes of the
  pipeline (records, Events, pod labels), counted by the API server itself, per failure
  and per crash-looping pod and minute, over spans of the loop: `first`, its first
  `--crash-seconds`; `steady` (with `--crash-steady S`), the S seconds from
  `--crash-warmup` seconds into the loop, once the windows have grown (records at about
  60, 180 and 420 s after a key's first one, then every 300 s: the default warm-up keeps
  the 420-s record, and the handler's writes for it, out of the span). A span counts
  the writes the API server saw in it, so repeats still held when it ends are not in it;
  `whole_loop`: all the loop's writes, with what the publishers held when the loop
  ended, published as they stop.
- exact counts through the failover: the failures caused against what each replica
  counted. The stopped leader's count comes from its log (one `record handled` line per
  record it counted; the process is gone), the standby's from its
  execwatch_exec_failures_total (its log must agree); a record counted by both is
  doubled. The durable total, the sum of the Event series' counts, must agree too.
  Creates answered 409 by the ResourceQuota admission because it lost a race for the
  quota object (nothing was created; retried) are `quota_409_retried`.
- throughout: the API server's request rate (all clients: kwok's heartbeats included;
  also for 30 s before the burst, while nothing fails), the handlers' CPU seconds and RSS.

Results are printed and saved to .cache/bench/fleet.json.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import math
import shlex
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
from tests.support.agent.exec_failures import CountingRecords, exec_failure
from tests.support.kube.apiserver_fixtures import HANDLER_SA
from tests.support.kube.execwatch_process import ExecwatchProcess
from tests.support.kube.kwok import AGENT, ARCH_LABEL, FLEET_LABEL, TOLERATION, Fleet, fleet_cluster

from benchmarks.cluster_bench import (
    apiserver_requests,
    diff,
    lease_holder,
    percentile,
    records_left,
    wait_for,
)
from benchmarks.common import RESULTS, rss_mb, save
from execwatch import crd
from execwatch.agent.publisher import Publisher, PublisherConfig
from execwatch.handler.pod_events import CONTROLLER

NAMESPACE = "rollout"
WORKLOAD = "bad"
FILLER = ("fleet", 1000)  # namespace of the other pods, pods per Deployment
PIPELINE = ("execfailures", "events", "pods")  # pods: the handler's label patches
REPLICAS = ("fleet-a", "fleet-b")
FAILURES = "execwatch_exec_failures_total"
LOG_LINE_LIMIT = 8192  # a `record handled` line is a few hundred bytes


def deployment(name: str, replicas: int, arch: str | None = None) -> dict[str, Any]:
    """`replicas` pods on the kwok nodes (of `arch`: then one per node at most)."""
    labels = {"app": name}
    spec: dict[str, Any] = {
        "tolerations": [TOLERATION],
        "nodeSelector": {FLEET_LABEL: "true"},
        "containers": [{"name": "app", "image": f"registry.example/{name}:1"}],
    }
    if arch:
        spec["nodeSelector"][ARCH_LABEL] = arch
        spec["topologySpreadConstraints"] = [
            {
                "maxSkew": 1,
                "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": labels},
            }
        ]
    return {
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": spec},
        },
    }


# -- handler replicas --------------------------------------------------------------------


@dataclass
class Replica:
    """An `execwatch handler` process, logging each record it handles."""

    identity: str
    proc: ExecwatchProcess
    started: float  # time.monotonic() just before the process was started

    @property
    def pid(self) -> int:
        return self.proc.proc.pid

    def counted(self, namespace: str) -> float:
        return self.proc.metric(FAILURES, namespace=namespace)


def start_replica(kubeconfig: Path, identity: str, work: Path) -> Replica:
    args = ["handler", "--kubeconfig", str(kubeconfig), "--identity", identity]
    started = time.monotonic()
    proc = ExecwatchProcess(["--log-level", "info", *args], work / f"{identity}.log")
    return Replica(identity, proc, started)


def proc_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    ticks = 100.0  # USER_HZ
    return (int(fields[11]) + int(fields[12])) / ticks


def stop_replica(r: Replica, timeout: float = 20.0) -> float:
    """SIGTERM (SIGKILL after `timeout`); returns the CPU seconds the process used in all,
    read while it is a zombie, before it is reaped."""
    r.proc.proc.terminate()
    deadline = time.monotonic() + timeout
    while proc_state(r.pid) != "Z":
        if time.monotonic() > deadline:
            r.proc.proc.kill()
        time.sleep(0.02)
    cpu = cpu_seconds(r.pid)
    r.proc.proc.wait()
    return cpu


@dataclass
class Failover:
    """Stops the leader in a thread of its own, and times the standby's take-over."""

    fleet: Fleet
    leader: Replica
    standby: Replica
    result: dict[str, Any] = field(default_factory=dict)
    thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        t0 = time.monotonic()
        try:
            self.result["leader_cpu_s_at_exit"] = stop_replica(self.leader)
            self.result["leader_exited_s"] = round(time.monotonic() - t0, 2)
            with self.fleet.cluster.client() as admin:
                wait_for(lambda: lease_holder(admin) == self.standby.identity, 60, "take-over")
            self.result["standby_leads_s"] = round(time.monotonic() - t0, 2)
        except Exception as exc:  # reported: the run goes on, its counts say the rest
            self.result["error"] = repr(exc)[:300]

    def join(self) -> dict[str, Any]:
        if self.thread is not None:
            self.thread.join(timeout=90)
        return self.result


def handled_in_log(log: Path, namespace: str) -> list[tuple[str, int]]:
    """(record name, failures) of each `record handled ... result=handled` line of a
    handler's log for a pod in `namespace`: what that process counted, in order."""
    out: list[tuple[str, int]] = []
    with log.open(errors="replace") as f:
        for line in f:
            if 'msg="record handled"' not in line or len(line) > LOG_LINE_LIMIT:
                continue
            with contextlib.suppress(ValueError):  # a line cut short by a kill
                kv = dict(word.partition("=")[::2] for word in shlex.split(line))
                if kv.get("result") == "handled" and kv.get("pod", "").startswith(namespace + "/"):
                    out.append((kv["record"], int(kv["count"])))
    return out


# -- the fleet ---------------------------------------------------------------------------


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


def core_events(fleet: Fleet, namespace: str | None = None) -> list[Any]:
    with fleet.cluster.client() as api:
        core = client.CoreV1Api(api)
        if namespace is None:
            return list(core.list_event_for_all_namespaces().items)
        return list(core.list_namespaced_event(namespace).items)


def events_by_source(fleet: Fleet) -> dict[str, int]:
    """Every Event object in the cluster, by reporting component, reason and namespace."""
    out: dict[str, int] = {}
    for e in core_events(fleet):
        key = f"{e.reporting_component or e.source.component}/{e.reason} in {e.metadata.namespace}"
        out[key] = out.get(key, 0) + int(e.series.count if e.series else e.count or 1)
    return dict(sorted(out.items(), key=lambda kv: -kv[1])[:12])


def series_total(fleet: Fleet, namespace: str) -> int:
    """The failures execwatch's Event series in `namespace` say they hold: the durable count."""
    return sum(
        int(e.series.count if e.series else 1)
        for e in core_events(fleet, namespace)
        if e.reporting_component == CONTROLLER
    )


def worker_alive(publisher: Publisher) -> bool:
    thread = publisher._thread
    return thread is not None and thread.is_alive()


def start_agents(
    fleet: Fleet, agents: dict[str, Any], pods: list[Any], window: float, window_max: float
) -> list[NodeAgent]:
    def one(pod: Any) -> NodeAgent:
        node = pod["spec"]["nodeName"]
        api = fleet.cluster.rest(fleet.agent_token(agents[node]))
        cfg = PublisherConfig(
            node=node, aggregation_window=window, aggregation_window_max=window_max
        )
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


def idle_rate(fleet: Fleet, seconds: float) -> float:
    """The API server's requests/s while no failure happens: kwok's node heartbeats and
    Leases, the controllers, the handlers' Lease."""
    before, t0 = all_requests(fleet), time.monotonic()
    time.sleep(seconds)
    return round((all_requests(fleet) - before) / (time.monotonic() - t0), 1)


def populate(fleet: Fleet, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The `bad` pods Running (returned), and the other pods up to `--pods`."""
    namespace, per = FILLER
    others = max(0, args.pods - args.nodes - args.burst_nodes)
    with fleet.cluster.client() as api:
        core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
        core.create_namespace({"metadata": {"name": NAMESPACE}})
        apps.create_namespaced_deployment(
            NAMESPACE, deployment(WORKLOAD, args.burst_nodes, "arm64")
        )
        core.create_namespace({"metadata": {"name": namespace}})
        for i in range(0, others, per):
            apps.create_namespaced_deployment(
                namespace, deployment(f"app-{i // per}", min(per, others - i))
            )
        pods = fleet.wait_running(NAMESPACE, f"app={WORKLOAD}", args.burst_nodes, 600)
        bad = [api.sanitize_for_serialization(p) for p in pods]
    if others:
        fleet.wait_ready_replicas(namespace, others, 1800)
    return bad


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    t0 = time.monotonic()
    with fleet_cluster(work / "fleet", args.nodes) as fleet:
        agents_by_node = fleet.deploy_agents(timeout=600)
        pods = populate(fleet, args)
        setup_s = time.monotonic() - t0
        print(f"fleet up in {setup_s:.0f} s: {args.nodes} nodes, {args.pods} pods", flush=True)
        cluster = fleet.cluster
        handler_cfg = cluster.kubeconfig(
            cluster.service_account_token(*HANDLER_SA), work / "handler.kcfg"
        )
        replicas: list[Replica] = []
        agents: list[NodeAgent] = []
        try:
            startup = start_up(fleet, agents_by_node, handler_cfg, work, replicas)
            startup["apiserver_idle_requests_per_s"] = idle_rate(fleet, 30.0)
            print("start-up", json.dumps(startup), flush=True)
            agents = start_agents(
                fleet, agents_by_node, pods, args.crash_window, args.crash_window_max
            )
            return measure(args, fleet, replicas, agents) | {
                "nodes": args.nodes,
                "pods": args.pods,
                "bad_pods": len(pods),
                "fleet_setup_s": round(setup_s, 1),
                "start_up": startup,
            }
        finally:
            for a in agents:
                a.publisher.stop(flush_timeout=0)
                a.api.close()
            RESULTS.mkdir(parents=True, exist_ok=True)
            for r in replicas:
                r.proc.stop()
                shutil.copy(r.proc.log, RESULTS / f"fleet-handler-{r.identity}.log")


def start_up(
    fleet: Fleet, agents: dict[str, Any], kubeconfig: Path, work: Path, replicas: list[Replica]
) -> dict[str, Any]:
    """A record waits; the first replica starts and counts it; then the standby starts.
    Both are appended to `replicas` as they start."""
    node = fleet.nodes[0]
    pod = agents[node.name]
    api = fleet.cluster.rest(fleet.agent_token(pod))
    sink = CountingRecords(api, crd.DEFAULT_NAMESPACE)
    publisher = Publisher(PublisherConfig(node=node.name), sink)
    with fleet.cluster.client() as admin:
        failure = exec_failure(
            pod=admin.sanitize_for_serialization(pod),
            node_arch=node.arch,
            binary_arch="arm64" if node.arch == "amd64" else "amd64",
        )
        publisher.start()
        publisher.submit(failure)
        publisher.stop(flush_timeout=30)
        api.close()
        wait_for(lambda: records_left(admin) >= 1, 30, "the waiting record")
        leader = start_replica(kubeconfig, REPLICAS[0], work)
        replicas.append(leader)
        wait_for(lambda: lease_holder(admin) == leader.identity, 120, "the Lease")
        lease_s = time.monotonic() - leader.started
        wait_for(lambda: leader.counted(AGENT[0]) >= 1, 120, "the waiting record counted")
        first_s = time.monotonic() - leader.started
        time.sleep(5)
        rss = rss_mb(leader.pid)
        replicas.append(start_replica(kubeconfig, REPLICAS[1], work))
        wait_for(replicas[1].proc.serving, 60, "the standby")
        holder = lease_holder(admin)
    return {
        "lease_held_s": round(lease_s, 2),
        "first_record_counted_s": round(first_s, 2),
        "leader_rss_mb_5s_later": round(rss[0], 1),
        "leader_peak_rss_mb": round(rss[1], 1),
        "lease_holder_after_standby_started": holder,
    }


# -- the measurements --------------------------------------------------------------------


def measure(
    args: argparse.Namespace, fleet: Fleet, replicas: list[Replica], agents: list[NodeAgent]
) -> dict[str, Any]:
    leader, standby = replicas
    burst, caused_burst = burst_with_failover(args, fleet, leader, standby, agents)
    print("burst", json.dumps(burst), flush=True)
    crash, caused_crash, dead = crash_loop(args, fleet, standby, agents)
    print("crash", json.dumps(crash), flush=True)
    crash["events_by_source"] = events_by_source(fleet)
    rss, peak = rss_mb(standby.pid)
    return {
        "burst": burst,
        "crash": crash,
        "exact": exact_counts(fleet, leader, standby, caused_burst + caused_crash),
        "quota_409_retried": sum(a.sink.conflicts for a in agents),
        "publishers_dead": dead,
        "handler_rss_mb": round(rss, 1),
        "handler_peak_rss_mb": round(peak, 1),
    }


def burst_with_failover(
    args: argparse.Namespace,
    fleet: Fleet,
    leader: Replica,
    standby: Replica,
    agents: list[NodeAgent],
) -> tuple[dict[str, Any], int]:
    submitted: dict[str, float] = {}
    failover = Failover(fleet, leader, standby)
    requests0, t0 = all_requests(fleet), time.monotonic()
    cpu0 = {r.identity: cpu_seconds(r.pid) for r in (leader, standby)}
    with event_clock(fleet) as clock:
        gap = args.burst_seconds / len(agents)
        for i, a in enumerate(agents):
            if i == len(agents) // 2:
                failover.start()
            submitted[a.pod["metadata"]["name"]] = time.time()
            a.publisher.submit(exec_failure(pod=a.pod, node_arch="arm64", binary_arch="amd64"))
            time.sleep(gap)
        with contextlib.suppress(TimeoutError):  # reported as missing
            wait_for(lambda: len(clock.seen) >= len(agents), 180, "every pod's Event")
        burst_s = time.monotonic() - t0
        took = failover.join()
    latencies = [clock.seen[n] - submitted[n] for n in submitted if n in clock.seen] or [
        float("nan")
    ]
    with fleet.cluster.client() as admin:
        left = records_left(admin)
    handler_cpu = took.get("leader_cpu_s_at_exit", float("nan")) - cpu0[leader.identity]
    handler_cpu += cpu_seconds(standby.pid) - cpu0[standby.identity]
    burst = {
        "seconds": round(burst_s, 1),
        "leader_stopped_after_failures": len(agents) // 2,
        "failover": {k: v for k, v in took.items() if k != "leader_cpu_s_at_exit"},
        "events_missing": len(submitted) - len(clock.seen.keys() & submitted.keys()),
        "records_left": left,
        "watch_errors": clock.errors[:5],
        "latency_p50_s": round(percentile(latencies, 50), 3),
        "latency_p99_s": round(percentile(latencies, 99), 3),
        "latency_max_s": round(max(latencies), 3),
        "apiserver_requests_per_s": round((all_requests(fleet) - requests0) / burst_s, 1),
        "handlers_cpu_s": round(handler_cpu, 2),
    }
    return burst, len(submitted)


@dataclass(frozen=True)
class Reading:
    """The pipeline's writes so far, read at the start of a tick of the crash loop."""

    at_s: float  # seconds into the loop
    failures: int  # failures submitted before it
    writes: dict[str, float]


def writes_over(before: Reading, after: Reading, pods: int) -> dict[str, Any]:
    """The pipeline's writes between two readings, per failure and per pod and minute."""
    writes = diff(after.writes, before.writes)
    total, failures = sum(writes.values()), after.failures - before.failures
    seconds = after.at_s - before.at_s
    return {
        "from_s": round(before.at_s, 1),
        "seconds": round(seconds, 1),
        "failures": failures,
        "api_writes": writes,
        "writes_per_failure": round(total / failures, 4),
        "writes_per_pod_minute": round(total / pods / (seconds / 60), 2),
    }


def crash_spans(args: argparse.Namespace) -> dict[str, tuple[int, int]]:
    """The spans measured, as (first, end) tick numbers: a reading is taken at the start
    of a tick, before its failures are submitted."""

    every: float = args.crash_every

    def tick(seconds: float) -> int:
        return math.ceil(seconds / every - 1e-9)

    spans = {"first": (0, tick(args.crash_seconds))}
    if args.crash_steady > 0:
        start = tick(args.crash_warmup)
        spans["steady"] = (start, start + tick(args.crash_steady))
    return spans


def crash_loop(
    args: argparse.Namespace, fleet: Fleet, handler: Replica, agents: list[NodeAgent]
) -> tuple[dict[str, Any], int, int]:
    """(figures, failures caused, publishers whose worker died). The publishers are
    stopped at the end: everything they held is published."""
    spans = crash_spans(args)
    marks = {k for span in spans.values() for k in span}
    ticks = max(marks)
    readings: dict[int, Reading] = {}
    requests0, cpu0 = all_requests(fleet), cpu_seconds(handler.pid)
    t0 = time.monotonic()
    for k in range(ticks + 1):
        # Ticks on a fixed schedule: a slow reading delays one tick, not every later one.
        time.sleep(max(0.0, t0 + k * args.crash_every - time.monotonic()))
        if k in marks:
            readings[k] = Reading(time.monotonic() - t0, k * len(agents), pipeline_writes(fleet))
        if k == ticks:
            break
        for a in agents:
            a.publisher.submit(exec_failure(pod=a.pod, node_arch="arm64", binary_arch="amd64"))
    crash_s = time.monotonic() - t0
    # A publisher whose worker thread died (on an exception it does not handle) publishes
    # nothing more: what it held and what it is given after are lost.
    dead = sum(not worker_alive(a.publisher) for a in agents)
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda a: a.publisher.stop(flush_timeout=30), agents))
    with fleet.cluster.client() as admin:
        wait_for(lambda: records_left(admin) == 0, 300, "records handled")
    time.sleep(1)
    failures = ticks * len(agents)
    flushed = Reading(crash_s, failures, pipeline_writes(fleet))
    figures: dict[str, Any] = {
        "seconds": round(crash_s, 1),
        "failures": failures,
        "window_s": [args.crash_window, max(args.crash_window, args.crash_window_max)],
    }
    for name, (first, end) in spans.items():
        figures[name] = writes_over(readings[first], readings[end], len(agents))
    figures["whole_loop"] = writes_over(readings[0], flushed, len(agents))
    figures["apiserver_requests_per_s"] = round((all_requests(fleet) - requests0) / crash_s, 1)
    figures["handler_cpu_s"] = round(cpu_seconds(handler.pid) - cpu0, 2)
    return figures, failures, dead


def exact_counts(fleet: Fleet, stopped: Replica, standby: Replica, caused: int) -> dict[str, Any]:
    """What each replica counted, against the failures caused and the Event series."""
    by_stopped = handled_in_log(stopped.proc.log, NAMESPACE)
    rest = caused - sum(n for _, n in by_stopped)
    with contextlib.suppress(TimeoutError):  # a shortfall is reported as lost
        wait_for(lambda: standby.counted(NAMESPACE) >= rest, 30, "the new leader's count")
    by_standby = handled_in_log(standby.proc.log, NAMESPACE)
    metric = int(standby.counted(NAMESPACE))
    seen = collections.Counter(name for name, _ in by_stopped + by_standby)
    counted = sum(n for _, n in by_stopped) + metric
    return {
        "failures_caused": caused,
        "counted_by_stopped_leader": sum(n for _, n in by_stopped),
        "counted_by_new_leader": metric,
        "new_leader_log_agrees": sum(n for _, n in by_standby) == metric,
        "counted": counted,
        "lost": caused - counted,
        "records_counted_twice": sum(1 for c in seen.values() if c > 1),
        "event_series_total": series_total(fleet, NAMESPACE),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="benchmarks.fleet_bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=10000, help="Running pods in all")
    parser.add_argument("--burst-nodes", type=int, default=300)
    parser.add_argument("--burst-seconds", type=float, default=10.0)
    parser.add_argument("--crash-seconds", type=float, default=300.0)
    parser.add_argument("--crash-every", type=float, default=10.0)
    parser.add_argument("--crash-window", type=float, default=60.0, help="a key's first window")
    parser.add_argument(
        "--crash-window-max", type=float, default=300.0, help="the cap of a repeating key's window"
    )
    parser.add_argument(
        "--crash-steady", type=float, default=0.0, help="seconds of the steady span (0: none)"
    )
    parser.add_argument(
        "--crash-warmup", type=float, default=430.0, help="seconds into the loop it starts"
    )
    args = parser.parse_args(argv)
    if args.burst_nodes > int(args.nodes * 0.3):
        parser.error(f"--burst-nodes: only {int(args.nodes * 0.3)} of {args.nodes} nodes are arm64")
    if args.burst_nodes < 2:
        parser.error("--burst-nodes: at least 2 (the leader stops half-way)")
    if args.crash_seconds < args.crash_every or args.crash_every <= 0:
        parser.error("--crash-seconds: at least one tick of --crash-every (> 0)")
    if 0 < args.crash_steady < args.crash_every:
        parser.error("--crash-steady: 0 or at least one tick of --crash-every")
    with tempfile.TemporaryDirectory(prefix="execwatch-fleet-bench-") as tmp:
        result = run(args, Path(tmp))
    print(json.dumps(result, indent=2))
    print(f"saved {save('fleet', result)}")
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    return 0


if __name__ == "__main__":
    sys.exit(main())
