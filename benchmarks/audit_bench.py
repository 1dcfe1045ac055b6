"""`execwatch audit` of a large cluster: a real API server and a real registry on loopback.

    .venv/bin/python -m benchmarks.audit_bench [--nodes 1000] [--pods 10000] [--images 200]
        [--namespaces 20] [--profile]

The cluster (tests/support/kube/apiserver.py, no controllers: the audit only reads objects):
`--nodes` Nodes, 30 % arm64; `--pods` pods bound to them (spec.nodeName), spread over
`--namespaces` namespaces and owned as the controllers own them (Deployment -> ReplicaSet
-> Pod, StatefulSet, two DaemonSets with a pod per node, one pinned to amd64), each pod's
status naming the digest it pulled (`imageID`), as a kubelet reports it; plus CronJobs and
Deployments scaled to zero (audited from their tags) and a bare pod per namespace. Pods
carry an image pull secret; the audit uses its own credentials (`--registry-config`).

The images (tests/registry: a CNCF distribution registry with TLS, and bearer tokens from
its TokenServer, as public registries hand them out): `--images`
distinct ones, two versions per repository (`v1`, and `v2` also tagged `latest`), mixed:
honest amd64 glibc, honest amd64+arm64, lying amd64+arm64 (the arm64 entry carries amd64
binaries), musl, a glibc binary on a musl base, static. Each has its own application layer
(a unique binary and 64 KiB to 2 MiB of incompressible data) over a shared base layer.

`execwatch audit` runs as a user runs it, a process of its own with a kubeconfig: cold
(empty verdict and blob caches), then warm (the same cache directory). Per run: wall
seconds, peak RSS of the audit process (VmHWM, polled) and of the largest process of its
tree (the audit or a scan child, from wait4), images scanned and from the cache, and the
verdicts per architecture; and the warm run's time again with the table a user reads
(`--format table`). `--profile` also runs a warm audit under cProfile and prints its top
functions (saved to .cache/bench/audit-warm-profile.txt). Results are printed and saved to
.cache/bench/audit.json.
"""

from __future__ import annotations

import argparse
import base64
import collections
import io
import json
import math
import os
import pstats
import random
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client
from tests.support.binfmt.cbuild import HELLO_C, compile_c
from tests.support.binfmt.foreign_arch import FOREIGN
from tests.support.images.base_images import glibc_base, musl_base
from tests.support.images.imagebuild import Entry, Image, file, oci_layout, symlink
from tests.support.kube.apiserver import KubeCluster, make_pki, running_cluster
from tests.support.registry.registry_server import (
    PASSWORD,
    USER,
    Registry,
    TokenServer,
    running_registry,
)

from benchmarks.common import RESULTS, peak_while, save

ARCH = "kubernetes.io/arch"
ARM64_SHARE = 0.3
SECRET = "regcred"
KINDS = (  # (kind, share): what an image is, in the proportions the fleet has them
    ("glibc", 5),  # amd64 only, ready there
    ("multi", 4),  # amd64 + arm64, both ready
    ("lying", 2),  # amd64 + arm64, the arm64 entry is amd64 binaries
    ("musl", 3),  # amd64 musl, ready
    ("glibc-on-musl", 2),  # a glibc binary on a musl base: would fail
    ("static", 2),  # static musl, amd64 only
)
REPLICAS = (1, 2, 2, 3, 4, 6, 8, 12, 20, 40)


# -- images --------------------------------------------------------------------------------


@dataclass
class Parts:
    """What the images are made of: binaries and base layers, built once."""

    amd64_glibc: list[Entry]
    amd64_musl: list[Entry]
    arm64_glibc: list[Entry]
    hello: dict[str, bytes]  # glibc, musl, static (amd64), arm64


def parts(work: Path) -> Parts:
    hello = {
        "glibc": compile_c(work / "hello-glibc", HELLO_C, "gcc").read_bytes(),
        "musl": compile_c(work / "hello-musl", HELLO_C, "musl-gcc").read_bytes(),
        "static": compile_c(work / "hello-static", HELLO_C, "musl-gcc", "-static").read_bytes(),
    }
    root = FOREIGN / "arm64" / "root"
    if not (FOREIGN / ".complete-v1").exists():
        sys.exit(f"{FOREIGN} is missing: run dev/fetch-foreign.sh (make test does)")
    multiarch = "usr/lib/aarch64-linux-gnu"
    hello["arm64"] = (root / "usr/bin/hello").read_bytes()
    arm64 = [
        file(f"{multiarch}/ld-linux-aarch64.so.1",
             (root / multiarch / "ld-linux-aarch64.so.1").read_bytes()),
        file(f"{multiarch}/libc.so.6", (root / multiarch / "libc.so.6").read_bytes(), 0o644),
        symlink("usr/lib/ld-linux-aarch64.so.1", "aarch64-linux-gnu/ld-linux-aarch64.so.1"),
        symlink("lib", "usr/lib"),
        symlink("bin", "usr/bin"),
    ]  # fmt: skip
    loader = Path("/lib64/ld-linux-x86-64.so.2").resolve()
    libc = Path("/lib/x86_64-linux-gnu/libc.so.6").resolve()
    musl = Path("/lib/ld-musl-x86_64.so.1").resolve()
    return Parts(
        glibc_base({"loader": loader.read_bytes(), "libc": libc.read_bytes()}),
        musl_base(musl.read_bytes()),
        arm64,
        hello,
    )


def app_layer(rng: random.Random, binary: bytes) -> list[Entry]:
    """A unique application: the binary with a trailer of its own, and data."""
    size = int(64 * 1024 * 32 ** rng.random())  # 64 KiB .. 2 MiB, log-uniform
    return [
        file("usr/bin/app", binary + rng.randbytes(64)),
        file("srv/app/data.bin", rng.randbytes(size), 0o644),
    ]


def platforms(kind: str, p: Parts, rng: random.Random) -> list[Image]:
    def image(base: list[Entry], binary: str, arch: str = "amd64") -> Image:
        layers = [layer for layer in (base, app_layer(rng, p.hello[binary])) if layer]
        return Image(layers, arch, entrypoint=["/usr/bin/app"])

    if kind == "musl":
        return [image(p.amd64_musl, "musl")]
    if kind == "glibc-on-musl":
        return [image(p.amd64_musl, "glibc")]
    if kind == "static":
        return [image([], "static")]
    amd64 = image(p.amd64_glibc, "glibc")
    if kind == "glibc":
        return [amd64]
    if kind == "lying":  # the arm64 entry: the amd64 tree, stated as arm64
        return [amd64, image(p.amd64_glibc, "glibc", "arm64")]
    return [amd64, image(p.arm64_glibc, "arm64", "arm64")]


@dataclass(frozen=True)
class Pushed:
    repo: str  # host/name
    tag: str
    digest: str  # what a pod that pulled it reports (the index digest if multi-platform)
    kind: str

    @property
    def ref(self) -> str:
        return f"{self.repo}:{self.tag}"


def kind_of(repository: int) -> str:
    """One repository of each kind first, then the kinds in their shares."""
    if repository < len(KINDS):
        return KINDS[repository][0]
    cycle = [k for k, share in KINDS for _ in range(share)]
    return cycle[(repository * 7) % len(cycle)]


@contextmanager
def token_registry(work: Path) -> Iterator[tuple[Registry, Path]]:
    """The registry, and the CA bundle of it and its token server. Bearer tokens, as
    public registries hand out: with htpasswd alone, distribution checks the bcrypt hash
    on every request, a cost no real registry of this size has."""
    make_pki(work / "issuer-pki")
    tokens = TokenServer(work / "issuer", work / "issuer-pki")
    try:
        with running_registry(work / "registry", token_realm=tokens.realm,
                              token_cert=tokens.cert) as reg:  # fmt: skip
            bundle = work / "cas.pem"
            bundle.write_text((work / "issuer-pki" / "ca.crt").read_text() + reg.ca.read_text())
            certs = reg.workdir / "skopeo-certs"
            certs.mkdir()
            (certs / "ca.crt").write_text(bundle.read_text())
            yield reg, bundle
    finally:
        tokens.close()


def push(reg: Registry, layout: Path, images: list[Image], repo: str, tags: list[str]) -> str:
    """skopeo copy the layout to each tag of `repo`; returns the pushed digest."""
    certs = reg.workdir / "skopeo-certs"
    source = f"oci:{layout}" + (":test:latest" if len(images) > 1 else "")
    digests = set()
    for tag in tags:
        digest_file = layout / f"digest-{tag}"
        argv = ["skopeo", "copy", "--quiet", "--all", "--dest-cert-dir", str(certs),
                "--dest-creds", f"{USER}:{PASSWORD}", "--digestfile", str(digest_file),
                source, f"docker://{reg.host}/{repo}:{tag}"]  # fmt: skip
        subprocess.run(argv, check=True, capture_output=True)
        digests.add(digest_file.read_text().strip())
    (digest,) = digests
    return digest


def push_all(reg: Registry, work: Path, count: int) -> list[Pushed]:
    """`count` distinct images, two per repository: `v1`, and `v2` tagged `latest` too."""
    p = parts(work)

    def one(i: int) -> list[Pushed]:
        rng = random.Random(i)
        kind = kind_of(i // 2)  # both versions of a repository are of one kind
        repo = f"team-{i // 2 % 10}/app-{i // 2:03d}"
        tags = ["v1"] if i % 2 == 0 else ["v2", "latest"]
        images = platforms(kind, p, rng)
        digest = push(reg, oci_layout(work / "layouts" / str(i), images), images, repo, tags)
        return [Pushed(f"{reg.host}/{repo}", t, digest, kind) for t in tags]

    with ThreadPoolExecutor(3) as pool:
        return [x for batch in pool.map(one, range(count)) for x in batch]


# -- the cluster ---------------------------------------------------------------------------


@dataclass
class Plan:
    """The objects to create, in order (owners first), and the pods' statuses."""

    namespaces: list[str]
    nodes: list[dict[str, Any]]
    owners: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (kind, body)
    pods: list[dict[str, Any]] = field(default_factory=list)


def node_archs(count: int) -> list[str]:
    return [
        "arm64" if math.floor((i + 1) * ARM64_SHARE) > math.floor(i * ARM64_SHARE) else "amd64"
        for i in range(count)
    ]


def container(name: str, image: Pushed) -> dict[str, Any]:
    return {"name": name, "image": image.ref}


def pod_spec(containers: list[tuple[str, Pushed]], init: list[tuple[str, Pushed]],
             selector: dict[str, str] | None) -> dict[str, Any]:  # fmt: skip
    spec: dict[str, Any] = {
        "containers": [container(n, i) for n, i in containers],
        "imagePullSecrets": [{"name": SECRET}],
    }
    if init:
        spec["initContainers"] = [container(n, i) for n, i in init]
    if selector:
        spec["nodeSelector"] = selector
    return spec


def status(spec: dict[str, Any], images: dict[str, Pushed]) -> dict[str, Any]:
    """What a kubelet reports for a running pod: each container's image digest."""

    def of(key: str) -> list[dict[str, Any]]:
        return [
            {"name": c["name"], "image": c["image"], "ready": True, "restartCount": 0,
             "imageID": f"{images[c['image']].repo}@{images[c['image']].digest}",
             "state": {"running": {}}}
            for c in spec.get(key) or []
        ]  # fmt: skip

    return {"status": {"phase": "Running", "containerStatuses": of("containers"),
                       "initContainerStatuses": of("initContainers")}}  # fmt: skip


def owner_ref(kind: str, name: str, api_version: str = "apps/v1") -> list[dict[str, Any]]:
    # The uid is checked by the garbage collector only, which does not run here.
    uid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{kind}/{name}"))
    return [{"apiVersion": api_version, "kind": kind, "name": name, "uid": uid,
             "controller": True}]  # fmt: skip


@dataclass
class Placer:
    """Binds pods to nodes round-robin, among the nodes a selector allows."""

    archs: list[str]
    cursor: dict[str, int] = field(default_factory=dict)

    def node(self, selector: dict[str, str] | None) -> str:
        arch = (selector or {}).get(ARCH, "")
        pool = [i for i, a in enumerate(self.archs) if not arch or a == arch]
        n = self.cursor.get(arch, 0)
        self.cursor[arch] = n + 1
        return f"node-{pool[n % len(pool)]:04d}"


def plan(args: argparse.Namespace, images: list[Pushed]) -> Plan:
    rng = random.Random(0)
    archs = node_archs(args.nodes)
    namespaces = [f"team-{i:02d}" for i in range(args.namespaces)]
    nodes = [
        {"metadata": {"name": f"node-{i:04d}",
                      "labels": {ARCH: a, "kubernetes.io/os": "linux",
                                 "kubernetes.io/hostname": f"node-{i:04d}"}}}
        for i, a in enumerate(archs)
    ]  # fmt: skip
    out = Plan(namespaces, nodes)
    placer = Placer(archs)
    by_kind = collections.defaultdict(list)
    for im in images:
        by_kind[im.kind].append(im)
    left = args.pods - len(namespaces)  # a bare pod in each namespace
    if left >= 3 * args.nodes:  # a log agent on every node, an exporter on the amd64 ones
        for name, image, sel in (("log-agent", by_kind["multi"][0], None),
                                 ("exporter", by_kind["glibc"][0], {ARCH: "amd64"})):  # fmt: skip
            spec = pod_spec([("main", image)], [], sel)
            out.owners.append(("DaemonSet", workload(namespaces[0], name, spec)))
            for i, a in enumerate(archs):
                if sel is None or a == sel[ARCH]:
                    out.pods.append(pod(namespaces[0], f"{name}-{i:04d}", f"node-{i:04d}",
                                        ("DaemonSet", name), spec))  # fmt: skip
                    left -= 1
    k = 0
    while left > 0:
        image = images[k % len(images)]
        ns = namespaces[k % len(namespaces)]
        sidecar = [("proxy", images[(k * 7 + 3) % len(images)])] if k % 5 == 4 else []
        init = [("migrate", images[(k * 11 + 5) % len(images)])] if k % 7 == 6 else []
        sel = selector(image, rng)
        spec = pod_spec([("main", image), *sidecar], init, sel)
        uncovered = max(0, len(images) - k - 1)  # a pod for every image, where pods allow
        replicas = max(1, min(left - uncovered, rng.choice(REPLICAS)))
        name = f"app-{k:04d}"
        if k % 10 == 9:
            out.owners.append(("StatefulSet", workload(ns, name, spec, replicas, "StatefulSet")))
            owner = ("StatefulSet", name)
        else:
            out.owners.append(("Deployment", workload(ns, name, spec, replicas)))
            rs = workload(ns, f"{name}-6f8d9", spec, replicas)
            rs["metadata"]["ownerReferences"] = owner_ref("Deployment", name)
            out.owners.append(("ReplicaSet", rs))
            owner = ("ReplicaSet", f"{name}-6f8d9")
        for r in range(replicas):
            out.pods.append(pod(ns, f"{owner[1]}-{r}", placer.node(sel), owner, spec))
        left -= replicas
        k += 1
    idle(out, namespaces, images)
    return out


def idle(out: Plan, namespaces: list[str], images: list[Pushed]) -> None:
    """Workloads without pods (audited from their tags) and bare pods."""
    for i, ns in enumerate(namespaces):
        image = images[(i * 13 + 1) % len(images)]
        spec = pod_spec([("main", image)], [], None) | {"restartPolicy": "Never"}
        cron = {"metadata": {"namespace": ns, "name": "nightly"},
                "spec": {"schedule": "0 3 * * *",
                         "jobTemplate": {"spec": {"template": {"spec": spec}}}}}  # fmt: skip
        out.owners.append(("CronJob", cron))
        stopped = workload(ns, "retired", pod_spec([("main", images[(i * 17 + 2) % len(images)])],
                                                   [], None), 0)  # fmt: skip
        out.owners.append(("Deployment", stopped))
        bare = pod_spec([("main", images[(i * 19 + 4) % len(images)])], [], None)
        out.pods.append(pod(ns, "debug", "node-0000", None, bare))


def selector(image: Pushed, rng: random.Random) -> dict[str, str] | None:
    """Half the amd64-only images' workloads are pinned to amd64, a quarter of the
    multi-platform ones to arm64; the rest may go anywhere."""
    if image.kind in ("multi", "lying"):
        return {ARCH: "arm64"} if rng.random() < 0.25 else None
    return {ARCH: "amd64"} if rng.random() < 0.5 else None


def workload(
    ns: str, name: str, spec: dict[str, Any], replicas: int | None = None, kind: str = ""
) -> dict[str, Any]:
    """A Deployment, ReplicaSet, StatefulSet (`kind`) or DaemonSet (no `replicas`)."""
    labels = {"app": name.split("-6f8d9")[0]}
    body: dict[str, Any] = {
        "selector": {"matchLabels": labels},
        "template": {"metadata": {"labels": labels}, "spec": spec},
    }
    if replicas is not None:
        body["replicas"] = replicas
    if kind == "StatefulSet":
        body["serviceName"] = name
    return {"metadata": {"namespace": ns, "name": name, "labels": labels}, "spec": body}


def pod(
    ns: str, name: str, node: str, owner: tuple[str, str] | None, spec: dict[str, Any]
) -> dict[str, Any]:
    meta: dict[str, Any] = {"namespace": ns, "name": name}
    if owner is not None:
        meta["ownerReferences"] = owner_ref(*owner)
        meta["labels"] = {"app": owner[1].split("-6f8d9")[0]}  # the owner's selector
    return {"metadata": meta, "spec": {**spec, "nodeName": node}}


def create(kube: KubeCluster, reg: Registry, p: Plan, images: dict[str, Pushed]) -> None:
    auth = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    dockercfg = json.dumps({"auths": {reg.host: {"auth": auth}}})
    with kube.client() as api:
        core = client.CoreV1Api(api)
        apps, batch = client.AppsV1Api(api), client.BatchV1Api(api)
        make: dict[str, Callable[..., Any]] = {
            "Deployment": apps.create_namespaced_deployment,
            "ReplicaSet": apps.create_namespaced_replica_set,
            "StatefulSet": apps.create_namespaced_stateful_set,
            "DaemonSet": apps.create_namespaced_daemon_set,
            "CronJob": batch.create_namespaced_cron_job,
        }
        for ns in p.namespaces:
            core.create_namespace({"metadata": {"name": ns}}, _preload_content=False)
            core.create_namespaced_secret(ns, {
                "metadata": {"name": SECRET}, "type": "kubernetes.io/dockerconfigjson",
                "data": {".dockerconfigjson": base64.b64encode(dockercfg.encode()).decode()},
            }, _preload_content=False)  # fmt: skip

        def node(body: dict[str, Any]) -> None:
            core.create_node(body, _preload_content=False)

        def owner(kind_body: tuple[str, dict[str, Any]]) -> None:
            kind, body = kind_body
            make[kind](body["metadata"]["namespace"], body, _preload_content=False)

        def one_pod(body: dict[str, Any]) -> None:
            meta = body["metadata"]
            core.create_namespaced_pod(meta["namespace"], body, _preload_content=False)
            core.patch_namespaced_pod_status(
                meta["name"], meta["namespace"], status(body["spec"], images),
                _preload_content=False,
            )  # fmt: skip

        with ThreadPoolExecutor(8) as pool:
            for work, items in ((node, p.nodes), (owner, p.owners), (one_pod, p.pods)):
                list(pool.map(work, items))


# -- the audit -----------------------------------------------------------------------------


@dataclass
class Run:
    seconds: float
    rss_mb: float  # the audit process's own peak (VmHWM, polled)
    tree_peak_rss_mb: float  # the largest of it and its scan children (wait4)
    exit_code: int
    report: dict[str, Any]

    def figures(self) -> dict[str, Any]:
        verdicts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        for w in self.report.get("workloads", []):
            for arch, a in w["architectures"].items():
                verdicts[arch][a["status"]] += 1
            for arch in w["notScheduledOn"]:
                verdicts[arch]["not-scheduled"] += 1
        return {
            "seconds": round(self.seconds, 1),
            "peak_rss_mb": round(self.rss_mb, 1),
            "tree_peak_rss_mb": round(self.tree_peak_rss_mb, 1),
            "exit_code": self.exit_code,
            "workloads": len(self.report.get("workloads", [])),
            "scanned": self.report.get("scanned"),
            "from_cache": self.report.get("fromCache"),
            "verdicts": {a: dict(sorted(c.items())) for a, c in sorted(verdicts.items())},
        }


def hwm_poller(pid: int) -> AbstractContextManager[list[float]]:
    """The latest VmHWM of `pid` in MB, read every 50 ms until the block ends."""

    def hwm() -> float:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return 0.0

    return peak_while(hwm, 0.05)


def audit(
    argv: list[str], work: Path, name: str, python: list[str] | None = None, fmt: str = "json"
) -> Run:
    out = work / f"{name}.{fmt}"
    cmd = [*(python or [str(Path(sys.executable).with_name("execwatch"))]), "audit", *argv,
           "--format", fmt, "-o", str(out), "--no-progress"]  # fmt: skip
    env = {**os.environ, "XDG_CACHE_HOME": str(work / "xdg")}
    t0 = time.monotonic()
    with open(work / f"{name}.stderr", "wb") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env)
        with hwm_poller(proc.pid) as hwm:
            _, code, usage = os.wait4(proc.pid, 0)
    seconds = time.monotonic() - t0
    proc.returncode = os.waitstatus_to_exitcode(code)
    report = json.loads(out.read_text()) if out.exists() and fmt == "json" else {}
    if not out.exists():
        print((work / f"{name}.stderr").read_text()[-2000:], file=sys.stderr)
    return Run(seconds, hwm[0], usage.ru_maxrss / 1024, proc.returncode, report)


def profile_top(path: Path, count: int = 30) -> str:
    """execwatch's functions by cumulative time, then everything by own time."""
    buf = io.StringIO()
    stats = pstats.Stats(str(path), stream=buf)
    stats.sort_stats("cumulative").print_stats("execwatch", count)
    stats.sort_stats("tottime").print_stats(count)
    return buf.getvalue()


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    t0 = time.monotonic()
    with running_cluster(work / "kube") as kube, token_registry(work) as (reg, cas):
        pushed = push_all(reg, work, args.images)
        push_s = time.monotonic() - t0
        print(f"{args.images} images pushed in {push_s:.0f} s", flush=True)
        p = plan(args, pushed)
        create(kube, reg, p, {im.ref: im for im in pushed})
        setup_s = time.monotonic() - t0 - push_s
        print(f"{len(p.nodes)} nodes, {len(p.pods)} pods, {len(p.owners)} owners created"
              f" in {setup_s:.0f} s", flush=True)  # fmt: skip
        kubeconfig = kube.kubeconfig("execwatch-test-admin-token", work / "admin.kubeconfig")
        auth = reg.auth_file(work / "auth.json")
        argv = ["--kubeconfig", str(kubeconfig), "--registry-config", str(auth),
                "--registry-ca", str(cas), "--cache-dir", str(work / "cache")]  # fmt: skip
        cold = audit(argv, work, "cold")
        print("cold", json.dumps(cold.figures()), flush=True)
        warm = audit(argv, work, "warm")
        print("warm", json.dumps(warm.figures()), flush=True)
        table = audit(argv, work, "warm-table", fmt="table")
        print(f"warm, --format table: {table.seconds:.1f} s", flush=True)
        result: dict[str, Any] = {
            "nodes": len(p.nodes),
            "pods": len(p.pods),
            "images": len({(im.repo, im.digest) for im in pushed}),
            "push_s": round(push_s, 1),
            "cluster_setup_s": round(setup_s, 1),
            "cold": cold.figures(),
            "warm": warm.figures(),
            "warm_table_s": round(table.seconds, 1),
            "warm_table_peak_rss_mb": round(table.rss_mb, 1),
        }
        if args.profile:
            prof = work / "warm.prof"
            python = [sys.executable, "-m", "cProfile", "-o", str(prof), "-m", "execwatch.cli"]
            profiled = audit(argv, work, "profiled", python)
            result["profiled_warm_s"] = round(profiled.seconds, 1)
            top = profile_top(prof)
            print(top, flush=True)
            RESULTS.mkdir(parents=True, exist_ok=True)
            (RESULTS / "audit-warm-profile.txt").write_text(top)
    return result


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="benchmarks.audit_bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=10000)
    parser.add_argument(
        "--images",
        type=int,
        default=200,
        help="distinct images, two per repository (>= 12: a repository of each kind first)",
    )
    parser.add_argument("--namespaces", type=int, default=20)
    parser.add_argument("--profile", action="store_true", help="also a warm run under cProfile")
    args = parser.parse_args(argv)
    if args.images < 2 * len(KINDS):
        parser.error(f"--images: at least {2 * len(KINDS)} (a repository of each kind)")
    if args.nodes < 4 or args.pods < args.namespaces:
        parser.error("at least 4 nodes, and a pod per namespace")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    with tempfile.TemporaryDirectory(prefix="execwatch-audit-bench-") as tmp:
        result = run(args, Path(tmp))
    print(json.dumps(result, indent=2))
    print(f"saved {save('audit', result)}")
    return 0 if result["cold"]["workloads"] and result["warm"]["scanned"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
