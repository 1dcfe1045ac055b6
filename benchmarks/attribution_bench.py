"""Attribution rate for containers that die at once, by the cgroup id the probe reported.

    .venv/bin/python -m benchmarks.attribution_bench [--tries 200] [--cpu-hogs N]
        [--runtime runc,containerd,containerd-pod-deleted]

Each try starts a container whose entrypoint is a foreign-architecture binary, so it
fails exec and exits within milliseconds. Only after the container is gone and its
cgroup removed does the benchmark ask the Attributor about the cgroup id the BPF
probe captured. A try counts as attributed when the answer names the right pod UID
and container id (and, with containerd, also the right namespace, pod and container
names from CRI).

- runc: kubelet-shaped cgroupsPath, cycling through both drivers and the three QoS
  classes; no CRI runtime knows these containers, so ids are all there is.
- containerd: a pod sandbox + container per try through the CRI plugin of a private
  containerd; the dead container stays in CRI, as the kubelet leaves it.
- containerd-pod-deleted: as above, but the pod (sandbox and containers) is removed
  from CRI before the lookup, so names exist only if the Attributor fetched them
  while the container lived (its prefetch on cgroup creation): the harshest case.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from tests.support.probe.probe_recorder import ProbeRecorder
from tests.support.runtime.containerd import Containerd
from tests.support.runtime.runc import (
    KubeletCgroup,
    Runc,
    remove_empty_kubepods,
    remove_pod_cgroups,
)

from benchmarks.common import require_root, save
from execwatch.attribution import Attributor
from execwatch.attribution.cri.client import CriContainers
from execwatch.attribution.mounts import cgroup_mounts
from execwatch.record import Attribution, AttributionStatus, KernelEvent


def cgroup_gone(path: str, timeout: float = 10.0) -> bool:
    unified = cgroup_mounts().unified
    assert unified is not None
    fs_path = unified.to_fs_path(path)
    deadline = time.monotonic() + timeout
    while fs_path is not None and fs_path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def timed_resolve(attributor: Attributor, event: KernelEvent) -> tuple[Attribution, float]:
    t0 = time.perf_counter()
    got = attributor.resolve(
        event.cgroup_id, event.tgid, name=event.cgroup_name, parent_id=event.cgroup_parent_id
    )
    return got, time.perf_counter() - t0


def bench_runc(tries: int, probe: ProbeRecorder, workdir: Path) -> dict[str, object]:
    runc = Runc(workdir)
    attributor = Attributor(containers=CriContainers(sockets=[]))
    attributor.start()
    shapes = itertools.cycle(
        itertools.product(("systemd", "cgroupfs"), ("guaranteed", "burstable", "besteffort"))
    )
    ok, gone_before_lookup, latencies, failures = 0, 0, [], []
    try:
        for i in range(tries):
            driver, qos = next(shapes)
            cgroup = KubeletCgroup.new(driver, qos)
            try:
                foreign = runc.foreign_path(cgroup.container_id[:16])
                runc.run(cgroup, [foreign, "true"])
                event = probe.failed_exec(foreign)
                gone_before_lookup += cgroup_gone(cgroup.path, timeout=0)
                got, took = timed_resolve(attributor, event)
                latencies.append(took)
                if (got.pod_uid, got.container_id) == (cgroup.pod_uid, cgroup.container_id):
                    ok += 1
                else:
                    failures.append({"try": i, "driver": driver, "qos": qos, "got": str(got)})
            finally:
                remove_pod_cgroups(cgroup.pod_path)
    finally:
        attributor.close()
        runc.cleanup()
    return summary("runc", tries, ok, gone_before_lookup, latencies, failures)


def bench_containerd(
    tries: int, probe: ProbeRecorder, workdir: Path, *, delete_pod_first: bool
) -> dict[str, object]:
    containerd = Containerd(workdir)
    containerd.start()
    attributor = Attributor(containers=CriContainers(sockets=[containerd.socket]))
    attributor.start()
    ok, gone_before_lookup, latencies, failures = 0, 0, [], []
    try:
        for i in range(tries):
            name = f"crash-{i}-7d4b9c8f5-abcde"
            pod = containerd.run_pod(name, namespace="bench", labels={"pod-template-hash": "x"})
            foreign = containerd.foreign_path(pod)
            cid = containerd.create_container(pod, "app", [foreign, "true"])
            event = probe.failed_exec(foreign)
            containerd.wait_exited(cid)
            if delete_pod_first:
                containerd.remove_pod(pod)
            gone_before_lookup += cgroup_gone(f"{pod.cgroup_parent}/{cid}")
            got, took = timed_resolve(attributor, event)
            latencies.append(took)
            containerd.remove_pod(pod)
            expected = (AttributionStatus.ATTRIBUTED, pod.uid, cid, "bench", name, "app")
            actual = (got.status, got.pod_uid, got.container_id, got.namespace, got.pod)
            if (*actual, got.container) == expected:
                ok += 1
            else:
                failures.append({"try": i, "got": str(got)})
    finally:
        attributor.close()
        containerd.stop()
    name = "containerd-pod-deleted" if delete_pod_first else "containerd"
    return summary(name, tries, ok, gone_before_lookup, latencies, failures)


def summary(
    runtime: str,
    tries: int,
    ok: int,
    gone: int,
    latencies: list[float],
    failures: list[dict[str, object]],
) -> dict[str, object]:
    ordered = sorted(latencies) or [0.0]
    return {
        "runtime": runtime,
        "tries": tries,
        "attributed": ok,
        "rate": ok / tries if tries else 0.0,
        "cgroup_removed_before_lookup": gone,
        "resolve_p50_ms": statistics.median(ordered) * 1e3,
        "resolve_p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e3,
        "resolve_max_ms": ordered[-1] * 1e3,
        "failures": failures[:10],
    }


@contextlib.contextmanager
def cpu_hogs(count: int) -> Iterator[None]:
    hogs = [
        subprocess.Popen(["sha256sum", "/dev/zero"], stdout=subprocess.DEVNULL)
        for _ in range(count)
    ]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=200)
    parser.add_argument("--runtime", default="runc,containerd,containerd-pod-deleted")
    parser.add_argument(
        "--cpu-hogs", type=int, default=0, help="busy processes competing for the CPUs meanwhile"
    )
    args = parser.parse_args()
    require_root()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # clean up containers on kill
    results = []
    with (
        cpu_hogs(args.cpu_hogs),
        ProbeRecorder() as probe,
        tempfile.TemporaryDirectory(prefix="ew-attr-bench-") as tmp,
    ):
        for runtime in args.runtime.split(","):
            workdir = Path(tmp) / runtime
            workdir.mkdir()
            if runtime == "runc":
                result = bench_runc(args.tries, probe, workdir)
            elif runtime in ("containerd", "containerd-pod-deleted"):
                deleted = runtime == "containerd-pod-deleted"
                result = bench_containerd(args.tries, probe, workdir, delete_pod_first=deleted)
            else:
                parser.error(f"unknown runtime {runtime}")
            result["cpu_hogs"] = args.cpu_hogs
            result["loadavg_after"] = os.getloadavg()[0]
            results.append(result)
            print(
                f"{runtime:>22}: {result['attributed']}/{result['tries']} attributed "
                f"({100 * float(str(result['rate'])):.1f} %), cgroup already removed before "
                f"lookup in {result['cgroup_removed_before_lookup']}, resolve p50 "
                f"{float(str(result['resolve_p50_ms'])):.3f} ms, p99 "
                f"{float(str(result['resolve_p99_ms'])):.3f} ms"
            )
    remove_empty_kubepods()
    path = save(f"attribution-hogs{args.cpu_hogs}", {"results": results})
    print(f"results: {path}")


if __name__ == "__main__":
    main()
