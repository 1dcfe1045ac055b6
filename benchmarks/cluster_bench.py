"""The cluster pipeline on a real kube-apiserver + etcd (built by dev/k8s-tools.sh).

    .venv/bin/python -m benchmarks.cluster_bench [--failures 120] [--records 1000]
        [--crash-seconds 130] [--crash-window 60] [--skip latency,throughput,crash]
        [--old-src DIR] [--skip ...,agent]

Three measurements, each with the real processes and their own ServiceAccount tokens:

- latency: `execwatch agent` (real BPF probe, diagnosis, attribution with the node-scoped
  pod watch, publisher) and `execwatch handler` run as separate processes. A runc
  container sits in a kubelet-shaped cgroup for a Pod that exists in the API server;
  inside it, `--failures` different foreign-architecture binaries fail to exec, one
  after the other. Latency = when a watch on the pod's namespace sees the Warning Event
  minus the failure's kernel timestamp (the Event's eventTime is the record's firstSeen,
  taken from the BPF event). Also the agent's RSS once it has settled. Needs root.
- throughput: `--records` records (50 pods, every record a new Event series: the worst
  case) are created first; then `benchmarks/raw_handler.py` (raw requests doing the
  handler's calls per record with `--workers` threads) drains them, once on http.client
  and once on httpx2 (the handler's transport); then the same again for an `execwatch
  handler --workers N` process, timed from the moment it holds the Lease, and, with
  `--old-src DIR`, for the handler of another checkout's `src` (PYTHONPATH=DIR).
  Alternated `--rounds` times in one run; medians and their ratios (`handler_over_raw`:
  over raw httpx2), the API requests each made, client CPU seconds, peak RSS.
- agent: the agent's API path alone, in a fresh process: `agent.daemon` imported, the
  node-scoped pod watch synced and `--records` records published through its
  lightkube client; its peak RSS (VmHWM). No probe, so no root (latency has the real
  agent's RSS).
- crash: 3 containers keep failing 10 times a second for `--crash-seconds` through the
  agent's publisher (aggregation window `--crash-window`) while the handler runs. The
  API writes are counted by the API server itself (apiserver_request_total), by verb
  and resource: writes per failure and per container per minute.

Results are printed and saved to .cache/bench/cluster.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes import client, watch
from prometheus_client.parser import text_string_to_metric_families
from tests.support.agent.exec_failures import exec_failure
from tests.support.kube.apiserver import (
    ADMIN_TOKEN,
    MANIFESTS,
    KubeCluster,
    load_manifests,
    running_cluster,
)
from tests.support.kube.apiserver_fixtures import AGENT_SA, HANDLER_SA
from tests.support.kube.execwatch_process import ExecwatchProcess

from benchmarks.common import rss_mb, save
from execwatch import crd
from execwatch.agent.publisher import Publisher, PublisherConfig
from execwatch.agent.records import RecordApi

NODE = "bench-node"
WRITE_VERBS = ("POST", "PUT", "PATCH", "DELETE")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def make_pod(api: client.ApiClient, namespace: str, name: str, cid: str | None = None) -> Any:
    core = client.CoreV1Api(api)
    pod = core.create_namespaced_pod(
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "labels": {"pod-template-hash": "5f6d7c8b9"},
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "ReplicaSet",
                        "controller": True,
                        "name": "app-5f6d7c8b9",
                        "uid": str(uuid.uuid4()),
                    }
                ],
            },
            "spec": {"nodeName": NODE, "containers": [{"name": "app", "image": "app:1"}]},
        },
    )
    core.patch_namespaced_pod_status(
        name,
        namespace,
        {
            "status": {
                "phase": "Running",
                "containerStatuses": [
                    {
                        "name": "app",
                        "ready": True,
                        "restartCount": 0,
                        "image": "app:1",
                        "imageID": "",
                        "containerID": f"containerd://{cid or 'x'}",
                        "state": {"running": {}},
                    }
                ],
            }
        },
    )
    return pod


def start_execwatch(args: list[str], log: Path) -> ExecwatchProcess:
    return ExecwatchProcess(["--log-level", "warning", *args], log)


def handler_args(kubeconfig: Path) -> list[str]:
    return ["handler", "--kubeconfig", str(kubeconfig), "--identity", f"bench-{os.getpid()}"]


def wait_for(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            value = predicate()
            if value:
                return value
        time.sleep(0.05)
    raise TimeoutError(what)


def records_left(api: client.ApiClient) -> int:
    return len(
        client.CustomObjectsApi(api).list_namespaced_custom_object(
            crd.GROUP, crd.VERSION, crd.DEFAULT_NAMESPACE, crd.PLURAL
        )["items"]
    )


def lease_holder(api: client.ApiClient) -> str | None:
    try:
        lease = client.CoordinationV1Api(api).read_namespaced_lease(
            "execwatch-handler", crd.DEFAULT_NAMESPACE
        )
    except client.exceptions.ApiException:
        return None
    return lease.spec.holder_identity  # type: ignore[no-any-return]


def apiserver_requests(kube: KubeCluster, verbs: tuple[str, ...] = ()) -> dict[str, float]:
    """Requests served so far, keyed 'VERB resource[/subresource]' (all verbs if none)."""
    ctx = ssl.create_default_context(cafile=str(kube.ca))
    req = urllib.request.Request(
        kube.url + "/metrics", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
    )
    with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name != "apiserver_request":
            continue
        for s in family.samples:
            if s.name != "apiserver_request_total" or (verbs and s.labels.get("verb") not in verbs):
                continue
            key = f"{s.labels['verb']} {s.labels.get('resource', '')}"
            if s.labels.get("subresource"):
                key += "/" + s.labels["subresource"]
            out[key] = out.get(key, 0.0) + s.value
    return out


def apiserver_writes(kube: KubeCluster) -> dict[str, float]:
    """Mutating requests served so far, keyed 'VERB resource[/subresource]'."""
    return apiserver_requests(kube, WRITE_VERBS)


def diff(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0) > 0}


@contextlib.contextmanager
def fresh_namespace(api: client.ApiClient) -> Iterator[str]:
    name = f"bench-{uuid.uuid4().hex[:6]}"
    client.CoreV1Api(api).create_namespace(client.V1Namespace(metadata={"name": name}))
    yield name


# -- latency -----------------------------------------------------------------------------


def bench_latency(kube: KubeCluster, work: Path, failures: int) -> dict[str, Any]:
    from tests.support.runtime.runc import KubeletCgroup, Runc, remove_pod_cgroups

    if os.geteuid() != 0:
        raise SystemExit("the latency benchmark loads BPF programs: run it as root")
    agent_cfg = kube.kubeconfig(kube.node_token(*AGENT_SA, NODE), work / "agent.kcfg")
    handler_cfg = kube.kubeconfig(kube.service_account_token(*HANDLER_SA), work / "handler.kcfg")
    admin = kube.client()
    runc = Runc(work / "runc")
    cid = secrets.token_hex(32)
    with fresh_namespace(admin) as ns:
        pod = make_pod(admin, ns, "app-5f6d7c8b9-lat01", cid)
        cgroup = KubeletCgroup("systemd", "burstable", pod.metadata.uid, cid)
        seen: dict[str, float] = {}
        event_time: dict[str, float] = {}
        stop = threading.Event()

        def watch_events() -> None:
            with contextlib.suppress(Exception):  # the API server stops under it at the end
                watch_until_stopped()

        def watch_until_stopped() -> None:
            w = watch.Watch()
            for ev in w.stream(
                client.EventsV1Api(admin).list_namespaced_event, ns, timeout_seconds=600
            ):
                obj = ev["object"]
                path = obj.note.split(" could not exec ", 1)[-1].split(" (", 1)[0]
                if path not in seen:
                    seen[path] = time.time()
                    event_time[path] = obj.event_time.timestamp()
                if stop.is_set():
                    w.stop()

        watcher = threading.Thread(target=watch_events, daemon=True)
        watcher.start()
        handler = start_execwatch(handler_args(handler_cfg), work / "handler-latency.log")
        agent = start_execwatch(
            [
                "agent",
                "--kubeconfig",
                str(agent_cfg),
                "--node",
                NODE,
                "--pod-metadata",
                "api",
                "--spool-dir",
                str(work / "spool"),
            ],
            work / "agent.log",
        )
        name = None
        try:
            wait_for(
                lambda: agent.metric("execwatch_publisher_published_total") >= 0,
                60,
                "agent metrics",
            )
            wait_for(lambda: lease_holder(admin), 30, "handler lease")
            time.sleep(3)  # probe attached, pod watch synced
            name = runc.start_detached(cgroup, ["/bin/sleep", "600"])
            paths = [runc.foreign_path(f"lat{i:04d}") for i in range(failures)]
            called: dict[str, float] = {}
            for path in paths:
                called[path] = time.time()
                assert runc.exec(name, [path, "true"]) != 0
                time.sleep(0.05)
            wait_for(lambda: all(p in seen for p in paths), 60, "all Events")
            time.sleep(2)
            agent_rss, agent_peak = rss_mb(agent.proc.pid)
            handler_rss, handler_peak = rss_mb(handler.proc.pid)
        finally:
            stop.set()
            if name:
                runc.delete(name)
            agent.stop()
            handler.stop()
            runc.cleanup()
            remove_pod_cgroups(cgroup.pod_path)
    latencies = [seen[p] - event_time[p] for p in paths]
    from_call = [seen[p] - called[p] for p in paths]
    return {
        "failures": len(latencies),
        "from_exec_call_p50_s": round(percentile(from_call, 50), 3),
        "from_exec_call_p99_s": round(percentile(from_call, 99), 3),
        "from_kernel_event_p50_s": round(percentile(latencies, 50), 3),
        "from_kernel_event_p99_s": round(percentile(latencies, 99), 3),
        "max_s": round(max(latencies), 3),
        "mean_s": round(statistics.mean(latencies), 3),
        "agent_rss_mb": round(agent_rss, 1),
        "agent_peak_rss_mb": round(agent_peak, 1),
        "handler_rss_mb": round(handler_rss, 1),
        "handler_peak_rss_mb": round(handler_peak, 1),
    }


# -- throughput --------------------------------------------------------------------------


def make_records(
    kube: KubeCluster, admin: client.ApiClient, ns: str, records: int, tag: str
) -> None:
    """`records` records from the agent identity, over 50 pods, each a new Event series."""
    pods = [make_pod(admin, ns, f"app-5f6d7c8b9-{i:05d}") for i in range(50)]
    sink = RecordApi(kube.rest(kube.node_token(*AGENT_SA, NODE)), crd.DEFAULT_NAMESPACE)

    def create(i: int) -> None:
        p = pods[i % len(pods)]
        failure = exec_failure(
            pod=admin.sanitize_for_serialization(p),
            path=f"/usr/bin/tool-{i}",
            node_arch="amd64",
        )
        t = failure.event.time
        sink.create(
            crd.to_body(
                failure,
                name=f"{NODE}-{tag}-{i:08d}",
                namespace=crd.DEFAULT_NAMESPACE,
                node=NODE,
                first_seen=t,
                last_seen=t,
                count=1,
            )
        )

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(create, range(records)))


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench_raw(
    kube: KubeCluster, records: int, workers: int, transport: str = "httpx2"
) -> dict[str, Any]:
    admin = kube.client()
    with fresh_namespace(admin) as ns:
        make_records(kube, admin, ns, records, "raw")
        token = kube.service_account_token(*HANDLER_SA)
        before = apiserver_requests(kube)
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "benchmarks.raw_handler",
                kube.url,
                str(kube.ca),
                token,
                crd.DEFAULT_NAMESPACE,
                "--workers",
                str(workers),
                "--transport",
                transport,
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
        result["requests"] = diff(apiserver_requests(kube), before)
    return result


def bench_handler(
    kube: KubeCluster, work: Path, records: int, workers: int, src: str | None = None
) -> dict[str, Any]:
    """`execwatch handler` draining the records; `src`: the package from there instead."""
    admin = kube.client()
    handler_cfg = kube.kubeconfig(kube.service_account_token(*HANDLER_SA), work / "handler.kcfg")
    with fresh_namespace(admin) as ns:
        make_records(kube, admin, ns, records, "handler")
        args = [*handler_args(handler_cfg), "--workers", str(workers)]
        env = {**os.environ, "PYTHONPATH": src} if src else None
        handler = ExecwatchProcess(
            ["--log-level", "warning", *args], work / "handler-throughput.log", env=env
        )
        peak = 0.0
        try:
            wait_for(lambda: lease_holder(admin), 30, "handler lease")
            before = apiserver_requests(kube)
            cpu0 = cpu_seconds(handler.proc.pid)
            started = time.monotonic()
            while records_left(admin):
                peak = max(peak, rss_mb(handler.proc.pid)[0])
                if time.monotonic() - started > 600:
                    raise TimeoutError("handler did not drain the records")
                time.sleep(0.1)
            elapsed = time.monotonic() - started
            cpu = cpu_seconds(handler.proc.pid) - cpu0
            requests = diff(apiserver_requests(kube), before)
            handled = handler.metric("execwatch_handler_records_total", result="handled")
            counted = handler.metric("execwatch_exec_failures_total", namespace=ns)
            rss, hwm = rss_mb(handler.proc.pid)
        finally:
            handler.stop()
    return {
        "records": records,
        "handled": handled,
        "counted": counted,
        "seconds": round(elapsed, 2),
        "records_per_s": round(records / elapsed, 1),
        "cpu_s": round(cpu, 2),
        "requests": requests,
        "handler_rss_mb": round(rss, 1),
        "handler_peak_rss_mb": round(max(hwm, peak), 1),
    }


def bench_throughput(
    kube: KubeCluster, work: Path, records: int, workers: int, rounds: int, old_src: str | None
) -> dict[str, Any]:
    """Raw requests and the handler(s), alternately, on the same kind of backlog."""
    runs: dict[str, list[dict[str, Any]]] = {"raw_httpclient": [], "raw": [], "handler": []}
    if old_src:
        runs["handler_old"] = []
    for _ in range(rounds):
        for name in runs:
            if name.startswith("raw"):
                transport = "http.client" if name == "raw_httpclient" else "httpx2"
                result = bench_raw(kube, records, workers, transport)
            else:
                src = old_src if name == "handler_old" else None
                result = bench_handler(kube, work, records, workers, src)
            runs[name].append(result)
            print(name, json.dumps(result), flush=True)
    rate = {n: statistics.median(r["records_per_s"] for r in rs) for n, rs in runs.items()}
    out: dict[str, Any] = {"workers": workers, **runs}
    out.update({f"{n}_records_per_s": v for n, v in rate.items()})
    out["handler_over_raw"] = round(rate["handler"] / rate["raw"], 3)
    out["handler_over_raw_httpclient"] = round(rate["handler"] / rate["raw_httpclient"], 3)
    if old_src:
        out["handler_over_handler_old"] = round(rate["handler"] / rate["handler_old"], 3)
    return out


AGENT_CHILD = """
import sys, time
from execwatch.agent import daemon
from execwatch import crd
from execwatch.kube.client import Rest, config_for
from execwatch.agent.publisher import Publisher, PublisherConfig
from execwatch.agent.records import RecordApi
from tests.support.agent.exec_failures import exec_failure

url, ca, token, node, ns, pod, uid, records = sys.argv[1:]
api = Rest(config_for(url, ca, token))
cache = daemon.pod_cache(node, api)
cache.start()
assert cache.synced.wait(30), "pod watch not synced"
publisher = Publisher(
    PublisherConfig(node=node, aggregation_window=0.1, rate=1000, burst=1000),
    RecordApi(api, crd.DEFAULT_NAMESPACE),
)
publisher.start()
target = {"metadata": {"name": pod, "namespace": ns, "uid": uid}, "spec": {"nodeName": node}}
for i in range(int(records)):
    publisher.submit(exec_failure(pod=target, path=f"/usr/bin/agent-{i}"))
deadline = time.monotonic() + 120
while publisher.spooled() and time.monotonic() < deadline:
    time.sleep(0.1)
publisher.stop(flush_timeout=30)
cache.close()
status = open("/proc/self/status").read().split("\\n")
print([line for line in status if line.startswith("VmHWM")][0].split()[1])
"""


def bench_agent(kube: KubeCluster, records: int) -> dict[str, Any]:
    """The agent's API path (pod watch + publisher) in its own process: peak RSS."""
    admin = kube.client()
    with fresh_namespace(admin) as ns:
        pod = make_pod(admin, ns, "app-5f6d7c8b9-agent")
        token = kube.node_token(*AGENT_SA, NODE)
        argv = [kube.url, str(kube.ca), token, NODE, ns, pod.metadata.name, pod.metadata.uid]
        out = subprocess.run(
            [sys.executable, "-c", AGENT_CHILD, *argv, str(records)],
            check=True,
            capture_output=True,
            text=True,
        )
        created = records_left(admin)
        client.CustomObjectsApi(admin).delete_collection_namespaced_custom_object(
            crd.GROUP, crd.VERSION, crd.DEFAULT_NAMESPACE, crd.PLURAL
        )
    return {
        "records": records,
        "records_created": created,
        "agent_api_peak_rss_mb": round(int(out.stdout.split()[-1]) / 1024, 1),
    }


# -- crash loop --------------------------------------------------------------------------


def bench_crash_loop(
    kube: KubeCluster, work: Path, seconds: float, window: float
) -> dict[str, Any]:
    admin = kube.client()
    handler_cfg = kube.kubeconfig(kube.service_account_token(*HANDLER_SA), work / "handler.kcfg")
    containers, per_second = 3, 10
    with fresh_namespace(admin) as ns:
        pods = [
            admin.sanitize_for_serialization(make_pod(admin, ns, f"crash-{i}"))
            for i in range(containers)
        ]
        handler = start_execwatch(handler_args(handler_cfg), work / "handler-crash.log")
        publisher = Publisher(
            PublisherConfig(node=NODE, aggregation_window=window),
            RecordApi(kube.rest(kube.node_token(*AGENT_SA, NODE)), crd.DEFAULT_NAMESPACE),
        )
        try:
            wait_for(lambda: lease_holder(admin), 30, "handler lease")
            before = apiserver_writes(kube)
            publisher.start()
            submitted = 0
            start = time.monotonic()
            while time.monotonic() - start < seconds:
                for p in pods:
                    publisher.submit(exec_failure(pod=p, node_arch="amd64"))
                    submitted += 1
                time.sleep(1 / per_second)
            elapsed = time.monotonic() - start
            publisher.stop(flush_timeout=10)
            wait_for(lambda: records_left(admin) == 0, 60, "records handled")
            time.sleep(1)
            writes = diff(apiserver_writes(kube), before)
            counted = handler.metric("execwatch_exec_failures_total", namespace=ns)
            events = client.EventsV1Api(admin).list_namespaced_event(ns).items
        finally:
            handler.stop()
    pipeline = {k: v for k, v in writes.items() if not k.endswith("leases")}
    total = sum(pipeline.values())
    return {
        "containers": containers,
        "failures": submitted,
        "seconds": round(elapsed, 1),
        "aggregation_window_s": window,
        "counted_by_handler": counted,
        "events": len(events),
        "event_series_counts": sorted(int(e.series.count if e.series else 1) for e in events),
        "api_writes": pipeline,
        "lease_writes": {k: v for k, v in writes.items() if k.endswith("leases")},
        "writes_per_failure": round(total / submitted, 4),
        "writes_per_container_per_minute": round(total / containers / (elapsed / 60), 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="benchmarks.cluster_bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--failures", type=int, default=120)
    parser.add_argument("--records", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=16, help="raw client and handler")
    parser.add_argument("--rounds", type=int, default=2, help="raw/handler alternations")
    parser.add_argument("--crash-seconds", type=float, default=130.0)
    parser.add_argument("--crash-window", type=float, default=60.0)
    parser.add_argument("--skip", default="", help="comma-separated: latency,throughput,crash")
    parser.add_argument("--old-src", help="also time the handler of this `src` (PYTHONPATH)")
    args = parser.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="execwatch-bench-") as tmp:
        work = Path(tmp)
        with running_cluster(work / "kube") as kube:
            kube.apply(load_manifests())
            kube.apply(load_manifests(MANIFESTS / "optional"))
            benches: tuple[tuple[str, Callable[[], dict[str, Any]]], ...] = (
                ("agent", lambda: bench_agent(kube, min(args.records, 200))),
                ("latency", lambda: bench_latency(kube, work, args.failures)),
                (
                    "throughput",
                    lambda: bench_throughput(
                        kube, work, args.records, args.workers, args.rounds, args.old_src
                    ),
                ),
                (
                    "crash",
                    lambda: bench_crash_loop(kube, work, args.crash_seconds, args.crash_window),
                ),
            )
            for name, run in benches:
                if name in skip:
                    continue
                print(f"== {name}", flush=True)
                results[name] = run()
                print(json.dumps(results[name], indent=2), flush=True)
    path = save("cluster", results)
    print(f"saved {path}")
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    return 0


if __name__ == "__main__":
    sys.exit(main())
