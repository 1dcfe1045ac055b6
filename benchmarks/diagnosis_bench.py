"""How often the entrypoint of a container that dies at once is still diagnosed.

    .venv/bin/python -m benchmarks.diagnosis_bench [--tries 100] [--case missing-library]
    .venv/bin/python -m benchmarks.diagnosis_bench --cost [--calls 2000]

--cost measures instead what the sandbox costs per diagnosis: one real diagnosis (an
arm64 ELF on this node's file system, read through /proc/PID/root) made in the calling
thread, then handed to a diagnosis thread (the pipeline before the sandbox), then to the
pool of worker processes (execwatch.diagnosis.sandbox), reused call after call; also
what starting one worker (fork, rlimits, its first answer) costs and the memory each
worker holds on its own.

Each try creates a pod and a container through containerd's CRI plugin whose entrypoint
is an arm64 binary: it fails exec and the container is gone within milliseconds, with
no task left to read the image through. The node pipeline (probe -> diagnosis ->
attribution) must still say ForeignArchitecture/arm64, from the container's rootfs
found by its id and checked against the root inode the kernel reported. With --case,
the entrypoint is instead a case of tests/support/probe/deaths.py (an image of its root) that
dies right after a successful exec, and the case's reason is expected.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import queue
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tests.support.binfmt.elfbuild import ElfSpec, build_elf
from tests.support.probe.deaths import BY_NAME, DEATHS, KEEPALIVE, Death, DeathTracer
from tests.support.runtime.containerd import APP_IMAGE, Containerd, oci_archive_of
from tests.support.runtime.runc import FOREIGN_ARCH, FOREIGN_IN_ROOTFS

from benchmarks.common import require_root, rss_mb, save
from execwatch.attribution import Attributor
from execwatch.attribution.cri.client import CriContainers
from execwatch.diagnosis import FileDiagnoser
from execwatch.diagnosis.budget import SlowMounts
from execwatch.diagnosis.sandbox import DiagnosisPool
from execwatch.record import Diagnosis, ExecFailed, ExecFailure, Reason

EM_AARCH64 = 183


def case_image(containerd: Containerd, death: Death, tmp: Path) -> str:
    image = f"docker.io/execwatch/death-{death.name}:bench"
    root = death.container_root(tmp / death.name)
    containerd.import_image(oci_archive_of(tmp / f"{death.name}.tar", image, root, KEEPALIVE))
    return image


def run_once(
    containerd: Containerd, tracer: DeathTracer, name: str, command: list[str], image: str
) -> ExecFailure | None:
    """One pod whose entrypoint fails; the probe is consumed all along, as the agent does."""
    pod = containerd.run_pod(name, namespace="bench", labels={})
    try:
        containerd.create_container(pod, "app", command, image=image)
        return tracer.wait_for(
            lambda r: r.event.path == command[0] and r.attribution.pod_uid == pod.uid, 10
        )
    except AssertionError:  # nothing came within 10 s
        return None
    finally:
        containerd.remove_pod(pod)


def diagnosed(record: ExecFailure | None, death: Death | None) -> bool:
    if record is None:
        return False
    if death is not None:
        return record.diagnosis.reason is death.reason
    d = record.diagnosis
    return d.reason is Reason.FOREIGN_ARCHITECTURE and d.binary_arch == FOREIGN_ARCH


def own_failure(path: Path) -> ExecFailed:
    """A failed exec of `path` by this process, as the probe would report it."""
    return ExecFailed(
        time=time.time(),
        errno=errno.ENOEXEC,
        pid=os.getpid(),
        tgid=os.getpid(),
        ppid=os.getppid(),
        uid=os.getuid(),
        comm="bench",
        parent_comm="",
        path=str(path),
        cgroup_id=0,
        mntns=os.stat("/proc/self/ns/mnt").st_ino,
        syscall="execve",
        root_ino=os.stat("/").st_ino,
    )


def timings(call: Callable[[], Diagnosis], calls: int) -> dict[str, float]:
    """Median and 99th percentile of one call, in microseconds."""
    took = []
    for _ in range(calls):
        started = time.perf_counter()
        diagnosis = call()
        took.append(time.perf_counter() - started)
        assert diagnosis.reason is Reason.FOREIGN_ARCHITECTURE, diagnosis
    took.sort()
    return {
        "median_us": round(statistics.median(took) * 1e6, 1),
        "p99_us": round(took[int(len(took) * 0.99)] * 1e6, 1),
    }


def thread_handoff(diagnoser: FileDiagnoser, event: ExecFailed, calls: int) -> dict[str, float]:
    """The old design: the event queued to a diagnosis thread, the answer waited for."""
    jobs: queue.SimpleQueue[ExecFailed | None] = queue.SimpleQueue()
    answers: queue.SimpleQueue[Diagnosis] = queue.SimpleQueue()

    def work() -> None:
        while (job := jobs.get()) is not None:
            answers.put(diagnoser.diagnose(job))

    def ask() -> Diagnosis:
        jobs.put(event)
        return answers.get()

    worker = threading.Thread(target=work)
    worker.start()
    try:
        return timings(ask, calls)
    finally:
        jobs.put(None)
        worker.join()


def private_mb(pid: int) -> float:
    """What a worker holds on its own (Private_Clean + Private_Dirty), in MB."""
    total = 0
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith(("Private_Clean:", "Private_Dirty:")):
            total += int(line.split()[1])
    return round(total / 1024, 2)


def cost(calls: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        binary = Path(tmp) / "hello-arm64"
        binary.write_bytes(build_elf(ElfSpec(machine=EM_AARCH64)).data)
        event = own_failure(binary)
        slow = SlowMounts()
        diagnoser = FileDiagnoser(slow=slow)
        in_thread = timings(lambda: diagnoser.diagnose(event), calls)
        handed_to_thread = thread_handoff(diagnoser, event, calls)
        starts = []
        for _ in range(20):
            started = time.perf_counter()
            DiagnosisPool(diagnoser, size=1, slow=slow).close()
            starts.append(time.perf_counter() - started)
        pool = DiagnosisPool(diagnoser, size=2, slow=slow)
        try:
            in_worker = timings(lambda: pool.diagnose(event).diagnosis, calls)
            workers = [
                int(p) for p in Path(f"/proc/self/task/{os.getpid()}/children").read_text().split()
            ]
            memory = [private_mb(pid) for pid in workers]
        finally:
            pool.close()
    return {
        "calls": calls,
        "in_calling_thread": in_thread,
        "handed_to_a_thread": handed_to_thread,  # what the pipeline did before
        "handed_to_a_worker_process": in_worker,  # what it does now
        "sandbox_cost_us": round(in_worker["median_us"] - handed_to_thread["median_us"], 1),
        "worker_start_ms": round(statistics.median(starts) * 1e3, 2),
        "worker_private_mb": memory,
        "bench_rss_mb": round(rss_mb()[0], 1),
        "load_average": [round(x, 1) for x in os.getloadavg()],
    }


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=100)
    shown = [d.name for d in DEATHS if d.shown]
    parser.add_argument("--case", choices=shown, help="an early death instead")
    parser.add_argument("--cost", action="store_true", help="the sandbox's cost per diagnosis")
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args(argv)
    if args.cost:
        figures = cost(args.calls)
        print(json.dumps(figures, indent=2))
        print(f"saved {save('diagnosis_cost', figures)}")
        return figures
    require_root()
    death = BY_NAME[args.case] if args.case else None
    command = list(death.argv) if death else [FOREIGN_IN_ROOTFS]
    reasons: dict[str, int] = {}
    why: dict[str, int] = {}  # the detail of each miss: what the diagnosis could not read
    with tempfile.TemporaryDirectory() as tmp:
        containerd = Containerd(Path(tmp))
        containerd.start()
        try:
            image = case_image(containerd, death, Path(tmp)) if death else APP_IMAGE
            with (
                Attributor(containers=CriContainers(sockets=[containerd.socket])) as attributor,
                DeathTracer.open(show_crashes=False, attributor=attributor) as tracer,
            ):
                for i in range(args.tries):
                    record = run_once(containerd, tracer, f"bench-{i}", command, image)
                    key = (
                        "diagnosed"
                        if diagnosed(record, death)
                        else (str(record.diagnosis.reason) if record else "missing")
                    )
                    reasons[key] = reasons.get(key, 0) + 1
                    if record is not None and key != "diagnosed":
                        why.setdefault(record.diagnosis.detail, 0)
                        why[record.diagnosis.detail] += 1
                    tracer.records.clear()
        finally:
            containerd.stop()
    result: dict[str, object] = {
        "case": args.case or "foreign-architecture",
        "tries": args.tries,
        "outcomes": reasons,
        "misses": why,
        "diagnosis_rate": round(reasons.get("diagnosed", 0) / args.tries, 4),
    }
    print(json.dumps(result, indent=2))
    print(f"saved {save('diagnosis', result)}")
    return result


if __name__ == "__main__":
    main()
