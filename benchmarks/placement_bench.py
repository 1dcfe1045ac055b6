"""Placement's latency on the real control plane, with `execwatch placement` as the chart runs it.

    .venv/bin/python -m benchmarks.placement_bench [--creates 1000] [--first-seen 20]
        [--burst 1000] [--creators 4] [--only creates]

The API server (tests/kube), the chart's placement objects (ServiceAccount, RBAC, the
ImageVerdict CRD, the certificate Secret, the Deployment and the
MutatingWebhookConfiguration, pointed at loopback instead of the Service), two nodes
(amd64, arm64) and the real registry on loopback, which wants the pods' pull secret. The
`execwatch placement` process runs with the chart's ServiceAccount token; a thread plays
the kubelet and copies the certificate Secret into its TLS directory.

- gate to ungate (the process leads): pods of `--first-seen` images, each a new digest
  whose arm64 manifest holds x86-64 binaries (placed on amd64 only), one at a time:
  first-seen (resolved and scanned from the registry); then one pod of each again, once
  its ImageVerdict is written: warm. Then `--burst` pods of those images created by
  `--creators` threads at once: ungate latency p50/p99 and throughput. Latency = when a
  watch on the namespace sees the pod without its gate minus when its create returned.
  The process's peak RSS (VmHWM) and CPU seconds (its own, and its scans' processes).
- create latency (a fresh process serves the webhook while another holder keeps the
  Lease, so the controller stands by and its placing work shares no CPU with the
  creates): `--creates` pods in a namespace without the label and as many in an `enforce`
  namespace, alternated: p50/p99 of each create call and the p99 the webhook adds.
  `--only creates` runs this part alone.

Printed as a table and saved to .cache/bench/placement.json.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import signal
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client, watch
from tests.support.binfmt.cbuild import HELLO_C, compile_c
from tests.support.deploy.chart import find, render
from tests.support.images.base_images import glibc_base
from tests.support.images.imagebuild import Image, file, oci_layout
from tests.support.kube.apiserver import KubeCluster, free_port, load_manifests, running_cluster
from tests.support.kube.execwatch_process import ExecwatchProcess
from tests.support.placement.chart_placement import (
    NAME,
    NODES,
    NS,
    VERDICTS,
    WEBHOOKS,
    Kubelet,
    ca_bundle_set,
    hold_lease,
    loopback,
    own_env,
    placement_rights,
)
from tests.support.registry.registry_server import (
    PASSWORD,
    USER,
    Registry,
    running_registry,
    running_token_registry,
)

from benchmarks.cluster_bench import percentile, wait_for
from benchmarks.common import rss_mb, save
from benchmarks.fleet_bench import cpu_seconds
from execwatch.placement.webhook import GATE, MODE_LABEL

ARCHES = ("amd64", "arm64")
TARGETS = {"webhook_added_p99_ms": 5.0, "burst_ungate_p99_s": 1.0}


# -- the cluster, the registry and the images --------------------------------------------


def install_chart(kube: KubeCluster, port: int) -> None:
    """The chart's placement objects, the webhook at `port` on loopback, and the nodes."""
    docs = render("placement.enabled=true")
    made = placement_rights(docs)
    made.append(find(docs, "CustomResourceDefinition", VERDICTS))
    made.append(find(docs, "Secret", f"{NAME}-tls"))
    made.append(find(docs, "Deployment", NAME))
    made.extend(loopback(find(docs, kind, NAME), port) for kind in WEBHOOKS)
    kube.apply(load_manifests())
    kube.apply(made)
    with kube.client() as api:
        for node, arch in NODES.items():
            labels = {"kubernetes.io/arch": arch}
            client.CoreV1Api(api).create_node({"metadata": {"name": node, "labels": labels}})


def host_glibc() -> dict[str, bytes]:
    loader = Path("/lib64/ld-linux-x86-64.so.2").resolve()
    libc = Path("/lib/x86_64-linux-gnu/libc.so.6").resolve()
    return {"loader": loader.read_bytes(), "libc": libc.read_bytes()}


def push_images(registry: Registry, work: Path, count: int, start: int = 0) -> list[str]:
    """`count` images, each its own digest: amd64 and arm64 in the index, x86-64 in both."""
    work.mkdir(parents=True, exist_ok=True)
    server = compile_c(work / "hello-glibc", HELLO_C, "gcc").read_bytes()
    base = glibc_base(host_glibc())
    refs = []
    for i in range(start, start + count):
        top = [file("usr/bin/server", server), file("etc/bench-id", f"{i}\n".encode(), 0o644)]
        images = [Image([base, top], arch, entrypoint=["/usr/bin/server"]) for arch in ARCHES]
        refs.append(registry.push(oci_layout(work / f"img{i}", images), f"bench/app{i}:1"))
    return refs


def namespace(api: client.ApiClient, mode: str | None, *registries: Registry) -> str:
    """A namespace (labelled `mode`) with the pull secret `pull` for `registries`."""
    name = f"bench-{mode or 'plain'}-{uuid.uuid4().hex[:6]}"
    labels = {MODE_LABEL: mode} if mode else {}
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": name, "labels": labels}})
    auth = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    config = json.dumps({"auths": {r.host: {"auth": auth} for r in registries}}).encode()
    core.create_namespaced_secret(name, {
        "metadata": {"name": "pull"},
        "type": "kubernetes.io/dockerconfigjson",
        "data": {".dockerconfigjson": base64.b64encode(config).decode()},
    })  # fmt: skip
    return name


def pod_body(name: str, image: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "imagePullSecrets": [{"name": "pull"}],
            "containers": [{"name": "app", "image": image}],
        },
    }


# -- the replica -------------------------------------------------------------------------


@dataclass
class Placement:
    """One `execwatch placement` process as the chart runs it (its ServiceAccount token,
    `--workers`), serving the webhook on loopback; the rest of test_cli.Replica's flags."""

    process: ExecwatchProcess

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.process.address}/healthz", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def log(self) -> str:
        return self.process.log.read_text(errors="replace")[-3000:]


def start_placement(kube: KubeCluster, d: Path, port: int, ca: Path, workers: int) -> Placement:
    kubeconfig = kube.kubeconfig(kube.service_account_token(NS, NAME), d / "kubeconfig")
    args = [
        "placement", "--kubeconfig", str(kubeconfig), "--namespace", NS,
        "--webhook-address", f"127.0.0.1:{port}", "--tls-dir", str(d / "tls"),
        "--service", "localhost", "--identity", d.name, "--workers", str(workers),
        "--lease-duration", "3", "--renew-deadline", "2", "--retry-period", "0.5",
        "--registry-ca", str(ca), "--cache-dir", str(d / "cache"),
        # mutual TLS: only the API server's client certificate is accepted
        "--webhook-client-ca", str(kube.webhook_client_ca),
        "--registry-allow-private", "127.0.0.0/8",  # the test registry is on loopback
    ]  # fmt: skip
    return Placement(ExecwatchProcess(args, d / "log", env=own_env(d)))


@contextlib.contextmanager
def replica(
    kube: KubeCluster, work: Path, port: int, registry: Registry, who: str, workers: int
) -> Iterator[Placement]:
    """`execwatch placement`, serving once the certificate is in its TLS dir."""
    directory = work / who
    (directory / "tls").mkdir(parents=True)
    with kube.client() as api:
        copier = Kubelet(api, directory / "tls")
        made = start_placement(kube, directory, port, registry.ca, workers)
        try:
            wait_for(made.healthy, 60, f"{who} healthy:\n{made.log()}")
            wait_for(lambda: ca_bundle_set(api), 30, f"caBundle:\n{made.log()}")
            yield made
        finally:
            made.process.stop()
            copier.stop.set()
            copier.thread.join()


# -- gate to ungate ----------------------------------------------------------------------


@dataclass
class Ungated:
    """When a watch on `ns` first saw each pod without the gate (time.time())."""

    api: client.ApiClient
    ns: str
    seen: dict[str, float] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        core = client.CoreV1Api(self.api)
        self._since = core.list_namespaced_pod(self.ns, limit=1).metadata.resource_version
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with contextlib.suppress(Exception):  # the API server stops under it at the end
            w = watch.Watch()
            for ev in w.stream(client.CoreV1Api(self.api).list_namespaced_pod, self.ns,
                               resource_version=self._since, timeout_seconds=3600):  # fmt: skip
                pod = ev["object"]
                gates = [g.name for g in pod.spec.scheduling_gates or []]
                if GATE not in gates and pod.metadata.name not in self.seen:
                    self.seen[pod.metadata.name] = time.time()
                if self.stop.is_set():
                    w.stop()

    def wait(self, names: list[str], timeout: float) -> None:
        wait_for(lambda: all(n in self.seen for n in names), timeout, "pods ungated")


def create(core: client.CoreV1Api, ns: str, name: str, image: str) -> tuple[float, float]:
    """(when the create call started, when it returned), time.time()."""
    started = time.time()
    made = core.create_namespaced_pod(ns, pod_body(name, image))
    if GATE not in [g.name for g in made.spec.scheduling_gates or []]:
        raise AssertionError(f"{ns}/{name} was not gated: is the webhook serving?")
    return started, time.time()


def one_at_a_time(
    core: client.CoreV1Api, ungated: Ungated, images: list[str], tag: str
) -> list[float]:
    """Gate-to-ungate seconds of one pod per image, each after the last one was placed."""
    out = []
    for i, image in enumerate(images):
        name = f"{tag}-{i:04d}"
        _, created = create(core, ungated.ns, name, image)
        ungated.wait([name], 60)
        out.append(ungated.seen[name] - created)
    return out


def burst(
    core: client.CoreV1Api, ungated: Ungated, images: list[str], n: int, creators: int
) -> dict[str, Any]:
    names = [f"burst-{i:05d}" for i in range(n)]

    def one(i: int) -> tuple[float, float]:
        return create(core, ungated.ns, names[i], images[i % len(images)])

    with ThreadPoolExecutor(creators) as pool:
        made = list(pool.map(one, range(n)))
    ungated.wait(names, 120 + n * 0.5)
    latency = [ungated.seen[name] - done for name, (_, done) in zip(names, made, strict=True)]
    first, last = min(s for s, _ in made), max(ungated.seen[name] for name in names)
    return {
        "pods": n,
        "ungate_p50_s": round(percentile(latency, 50), 3),
        "ungate_p99_s": round(percentile(latency, 99), 3),
        "ungate_max_s": round(max(latency), 3),
        "create_seconds": round(max(r for _, r in made) - first, 2),
        "ungated_per_s": round(n / (last - first), 1),
    }


def verdicts_written(api: client.ApiClient, images: list[str]) -> bool:
    found = client.CustomObjectsApi(api).list_cluster_custom_object(
        "execwatch.io", "v1alpha1", "imageverdicts"
    )
    done = {v["spec"]["image"] for v in found["items"]
            if len((v.get("status") or {}).get("platforms") or []) == len(ARCHES)}  # fmt: skip
    return done >= set(images)


def child_cpu_seconds(pid: int) -> float:
    """CPU seconds of `pid`'s children that it waited for (its scans' processes)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[13]) + int(fields[14])) / 100.0


@dataclass(frozen=True)
class Source:
    """Where the pods pull from: the registry, how it authenticates, the images there."""

    auth: str  # "token" (bearer tokens, as public registries) or "htpasswd" (basic, bcrypt)
    registry: Registry
    images: list[str]


def bench_ungate(
    kube: KubeCluster, work: Path, port: int, source: Source, args: argparse.Namespace
) -> dict[str, Any]:
    who = f"leader-{source.auth}"
    burst_pods = args.burst if source.auth == "token" else min(args.burst, args.htpasswd_burst)
    with (
        replica(kube, work, port, source.registry, who, args.workers) as leader,
        kube.client() as api,
    ):
        pid = leader.process.proc.pid
        cpu0 = cpu_seconds(pid)
        ns = namespace(api, "enforce", source.registry)
        ungated = Ungated(api, ns)
        core = client.CoreV1Api(api)
        first = one_at_a_time(core, ungated, source.images, "first")
        wait_for(lambda: verdicts_written(api, source.images), 60, "ImageVerdicts written")
        warm = one_at_a_time(core, ungated, source.images, "warm")
        burst_figures = burst(core, ungated, source.images, burst_pods, args.creators)
        ungated.stop.set()
        _, peak = rss_mb(pid)
        figures = {
            "first_seen": summary(first),
            "warm": summary(warm),
            "burst": {**burst_figures, "events": events_of(api, ns, "burst-", burst_pods)},
            "controller_peak_rss_mb": round(peak, 1),
            "controller_cpu_s": round(cpu_seconds(pid) - cpu0, 2),
            "scans_cpu_s": round(child_cpu_seconds(pid), 2),
        }
        core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
    return figures


def events_of(api: client.ApiClient, ns: str, prefix: str, pods: int) -> dict[str, int]:
    """`reasons`, once there is one Event per pod (each is posted after its pod's patch),
    or as they are 30 s later."""
    with contextlib.suppress(TimeoutError):
        wait_for(lambda: sum(reasons(api, ns, prefix).values()) >= pods, 30, "Events")
    return reasons(api, ns, prefix)


def reasons(api: client.ApiClient, ns: str, prefix: str) -> dict[str, int]:
    """How many of placement's Events about the pods named `prefix`... have each reason
    (PlacementSkipped: failed open, the pod ungated without a verdict)."""
    counted: dict[str, int] = {}
    for event in client.EventsV1Api(api).list_namespaced_event(ns).items:
        if event.regarding.name.startswith(prefix):
            counted[event.reason] = counted.get(event.reason, 0) + 1
    return counted


def summary(seconds: list[float]) -> dict[str, Any]:
    return {
        "pods": len(seconds),
        "p50_s": round(percentile(seconds, 50), 3),
        "p99_s": round(percentile(seconds, 99), 3),
        "max_s": round(max(seconds), 3),
    }


# -- create latency ----------------------------------------------------------------------


def bench_creates(
    kube: KubeCluster, work: Path, port: int, registry: Registry, n: int
) -> dict[str, Any]:
    with kube.client() as api:
        hold_lease(api)
        plain, enforce = namespace(api, None, registry), namespace(api, "enforce", registry)
        core = client.CoreV1Api(api)
        with replica(kube, work, port, registry, "webhook", 4) as served:
            took: dict[str, list[float]] = {plain: [], enforce: []}
            for i in range(n):
                for ns in (plain, enforce) if i % 2 else (enforce, plain):
                    took[ns].append(timed_create(core, ns, f"p-{i:05d}", ns == enforce))
            _, peak = rss_mb(served.process.proc.pid)
        for ns in (plain, enforce):
            core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
    without, with_ = sorted(took[plain]), sorted(took[enforce])
    return {
        "creates_each": n,
        "without_p50_ms": round(percentile(without, 50) * 1000, 2),
        "without_p99_ms": round(percentile(without, 99) * 1000, 2),
        "with_p50_ms": round(percentile(with_, 50) * 1000, 2),
        "with_p99_ms": round(percentile(with_, 99) * 1000, 2),
        "webhook_added_p50_ms": round((percentile(with_, 50) - percentile(without, 50)) * 1000, 2),
        "webhook_added_p99_ms": round((percentile(with_, 99) - percentile(without, 99)) * 1000, 2),
        "webhook_replica_peak_rss_mb": round(peak, 1),
    }


def timed_create(core: client.CoreV1Api, ns: str, name: str, gated: bool) -> float:
    started = time.perf_counter()
    made = core.create_namespaced_pod(ns, pod_body(name, "r.example/app:1"))
    took = time.perf_counter() - started
    if (GATE in [g.name for g in made.spec.scheduling_gates or []]) != gated:
        raise AssertionError(f"{ns}/{name}: gated is not {gated}")
    return took


# -- the run ---------------------------------------------------------------------------


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    port = free_port()
    with (
        running_registry(work / "registry") as registry,
        running_token_registry(registry, work) as token_side,
        running_cluster(work / "kube") as kube,
    ):
        install_chart(kube, port)
        ungate = {}
        for i, auth in enumerate([] if args.only == "creates" else args.auth):
            tokened = token_side.registry
            served = tokened if auth == "token" else registry
            # pushed through the token registry: htpasswd's bcrypt would cost seconds a push
            pushed = push_images(tokened, work / "images", args.first_seen, i * args.first_seen)
            source = Source(auth, served, [r.replace(tokened.host, served.host) for r in pushed])
            ungate[auth] = bench_ungate(kube, work, port, source, args)
        if args.only == "creates":  # one replica leads once: the certificate and caBundle
            with replica(kube, work, port, registry, "issuer", args.workers):
                pass
        create = bench_creates(kube, work, port, registry, args.creates)
    return {"create": create, "ungate": ungate}


Row = tuple[str, str, str, str]


def table(result: dict[str, Any]) -> str:
    c = result["create"]
    n = c["creates_each"]
    rows: list[Row] = [
        ("figure", "p50", "p99", "target"),
        (f"pod create, no webhook ({n})", ms(c, "without_p50"), ms(c, "without_p99"), ""),
        (f"pod create, webhook, gated ({n})", ms(c, "with_p50"), ms(c, "with_p99"), ""),
        ("added by the webhook", ms(c, "webhook_added_p50"), ms(c, "webhook_added_p99"), "5 ms"),
    ]
    for auth, figures in result["ungate"].items():
        rows += ungate_rows(auth, figures)
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in rows)
    return "\n".join(line.rstrip() for line in lines)


def ms(figures: dict[str, Any], key: str) -> str:
    return f"{figures[key + '_ms']} ms"


def ungate_rows(auth: str, u: dict[str, Any]) -> list[Row]:
    first, warm, b = u["first_seen"], u["warm"], u["burst"]
    open_ = b["events"].get("PlacementSkipped", 0)
    cpu = f"{u['controller_cpu_s']} + {u['scans_cpu_s']} s"
    return [
        (f"[{auth}] gate->ungate, first-seen digest ({first['pods']})",
         f"{first['p50_s']} s", f"{first['p99_s']} s", ""),
        (f"[{auth}] gate->ungate, warm verdict ({warm['pods']})",
         f"{warm['p50_s']} s", f"{warm['p99_s']} s", ""),
        (f"[{auth}] gate->ungate, {b['pods']} warm at once",
         f"{b['ungate_p50_s']} s", f"{b['ungate_p99_s']} s", "1 s"),
        (f"[{auth}] burst: ungated/s, failed open",
         f"{b['ungated_per_s']}/s", f"{open_} open", "0"),
        (f"[{auth}] controller peak RSS, CPU (own + scans)",
         f"{u['controller_peak_rss_mb']} MB", cpu, ""),
    ]  # fmt: skip


def auths(text: str) -> list[str]:
    chosen = [a for a in text.split(",") if a]
    if not chosen or set(chosen) - {"token", "htpasswd"}:
        raise argparse.ArgumentTypeError("wants token, htpasswd or token,htpasswd")
    return chosen


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="benchmarks.placement_bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--creates", type=int, default=1000, help="per namespace")
    parser.add_argument("--first-seen", type=int, default=20, help="images, each a new digest")
    parser.add_argument("--burst", type=int, default=1000, help="warm gated pods at once")
    parser.add_argument("--htpasswd-burst", type=int, default=50, help="the same, htpasswd")
    parser.add_argument("--creators", type=int, default=4, help="threads creating the burst")
    parser.add_argument("--workers", type=int, default=16, help="the controller's (the chart's 16)")
    parser.add_argument("--auth", type=auths, default=["token", "htpasswd"], help="registries")
    parser.add_argument("--only", choices=["creates"], help="run only the create latency")
    parser.add_argument("--keep", metavar="DIR", help="work here and keep it (the replicas' logs)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.keep:
        result = run(args, Path(args.keep))
    else:
        with tempfile.TemporaryDirectory(prefix="execwatch-placement-bench-") as tmp:
            result = run(args, Path(tmp))
    print(json.dumps(result, indent=2))
    print(table(result))
    print(f"saved {save('placement', result)}")
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    return 0


if __name__ == "__main__":
    sys.exit(main())
