"""Kernel and agent cost of the probe, side by side with the seed's bpftrace one-liner.

    .venv/bin/python -m benchmarks.probe_bench [--storm-rate 12000 --storm-seconds 10]

1. bpf_stats (kernel.bpf_stats_enabled=1) gives run_time_ns / run_cnt per program. With
   our probe and `bpftrace -e 'tracepoint:syscalls:sys_exit_execve /args->ret == -8/ {...}'`
   attached together, a batch of successful execs, then a batch of failing ones, gives
   each program's kernel time per exec.
2. A failure storm: failing execs at --storm-rate per second for --storm-seconds, from a
   generator in its own cgroup, while this process runs what `execwatch trace --json`
   runs (probe -> diagnosis -> attribution with its cgroup inventory and CRI client ->
   folding -> JSON printer, to /dev/null). Reports agent user CPU per
   delivered event, RSS, delivered / aggregated / dropped, and whether the kernel's
   per-cgroup count equals the number of failures the generator caused.
3. The early-death hooks: in the same batches, the kernel time per process exit of the
   exit_group program, and of execwatch's exec program next to a program that only
   returns (benchmarks/return_only.bpf.c) on the same tracepoint.
4. An early-death storm: --death-rate processes per second for --death-seconds, each a
   real binary whose DT_NEEDED library was deleted, so glibc's loader exits 127. Reports
   the kernel's exact count, delivered / folded, and agent user CPU per delivered event.

The machine is shared by several engineers: figures are noisy, compare within one run.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import json
import os
import resource
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks.common import build_c, require_root, rss_mb, save, sysctl
from execwatch.attribution import Attributor
from execwatch.attribution.mounts import cgroup_mounts
from execwatch.diagnosis import FileDiagnoser
from execwatch.output import Printer
from execwatch.pipeline import NodePipeline
from execwatch.probe import Probe
from execwatch.probe.events import boot_to_epoch_offset
from execwatch.probe.libbpf import load_libbpf
from execwatch.probe.loader import ProbeOptions
from execwatch.record import Reason

ONE_LINER = (
    "tracepoint:syscalls:sys_exit_execve /args->ret == -8/ "
    '{ printf("Exec format error detected for PPID %d\\n", curtask->real_parent->pid); }'
)
FOREIGN = Path(__file__).resolve().parent.parent / ".cache/foreign/arm64/root/usr/bin/hello"
HERE = Path(__file__).resolve().parent


def multiarch() -> str:
    out = subprocess.run(["gcc", "-print-multiarch"], capture_output=True, text=True)
    return out.stdout.strip() or f"{os.uname().machine}-linux-gnu"


@contextmanager
def return_only_program(tmp: Path) -> Iterator[int]:
    """Load and attach benchmarks/return_only.bpf.c through libbpf; yield its prog id."""
    obj_path = tmp / "return_only.bpf.o"
    source = HERE / "return_only.bpf.c"
    include = f"-I/usr/include/{multiarch()}"
    subprocess.run(
        ["clang", "-O2", "-target", "bpf", include, "-c", source, "-o", obj_path], check=True
    )
    lib = load_libbpf()
    obj = lib.bpf_object__open_file(str(obj_path).encode(), None)
    if not obj or lib.bpf_object__load(obj) < 0:
        raise RuntimeError("cannot load the return-only program")
    prog = lib.bpf_object__next_program(obj, None)
    link = lib.bpf_program__attach(prog)
    try:
        if not link:
            raise RuntimeError(f"cannot attach return_only: errno {ctypes.get_errno()}")
        yield fdinfo_prog_id(lib.bpf_program__fd(prog))
    finally:
        if link:
            lib.bpf_link__destroy(link)
        lib.bpf_object__close(obj)


DIES_MAIN = "extern int ew_gone(void);\nint main(void) { return ew_gone(); }\n"
DIES_LIB = "int ew_gone(void) { return 0; }\n"


def dying_binary(tmp: Path) -> Path:
    """A program linked against a library that is then deleted: glibc's loader exits 127."""
    (tmp / "gone.c").write_text(DIES_LIB)
    (tmp / "dies.c").write_text(DIES_MAIN)
    lib = tmp / "libewgone.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", lib, tmp / "gone.c"], check=True)
    binary = tmp / "dies"
    subprocess.run(["gcc", "-o", binary, tmp / "dies.c", f"-L{tmp}", "-lewgone"], check=True)
    lib.unlink()
    return binary


def bpftool() -> str:
    """By absolute path: a PATH search is itself a burst of failed execs, which would land
    in the phase being measured."""
    path = shutil.which("bpftool") or shutil.which("bpftool", path="/usr/sbin:/sbin")
    if path is None:
        raise SystemExit("bpftool is missing (make setup-test)")
    return path


def prog_stats(prog_id: int) -> tuple[int, int]:
    out = subprocess.run(
        [bpftool(), "prog", "show", "id", str(prog_id), "-j"], check=True, capture_output=True
    )
    info = json.loads(out.stdout)
    return int(info.get("run_time_ns", 0)), int(info.get("run_cnt", 0))


def tracepoint_prog_ids() -> set[int]:
    out = subprocess.run([bpftool(), "prog", "show", "-j"], check=True, capture_output=True)
    return {p["id"] for p in json.loads(out.stdout) if p.get("type") == "tracepoint"}


@contextmanager
def bpftrace_one_liner() -> Iterator[int]:
    before = tracepoint_prog_ids()
    proc = subprocess.Popen(
        [shutil.which("bpftrace") or "bpftrace", "-e", ONE_LINER], stdout=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 60
        while not (new := tracepoint_prog_ids() - before):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("bpftrace did not attach its program")
            time.sleep(0.2)
        yield new.pop()
    finally:
        proc.terminate()
        proc.wait()


@contextmanager
def own_cgroup(name: str) -> Iterator[Path]:
    """A cgroup v2 directory for the generator, so its failures can be counted apart."""
    unified = cgroup_mounts().unified
    if unified is None:
        raise SystemExit("no cgroup v2 hierarchy mounted: per-cgroup counts need one")
    path = unified.mountpoint / name
    path.mkdir(exist_ok=True)
    try:
        yield path
    finally:
        for _ in range(50):
            try:
                path.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def run_in(cgroup: Path, argv: list[str]) -> int:
    """Run argv inside cgroup; return the failed-exec count it prints."""
    out = subprocess.run(
        argv,
        check=True,
        capture_output=True,
        text=True,
        preexec_fn=lambda: (cgroup / "cgroup.procs").write_text(str(os.getpid())),
    )
    return int(out.stdout.strip() or 0)


class Consumer:
    """The agent's node pipeline, polled on a thread like `execwatch trace` does."""

    def __init__(self, probe: Probe, attributor: Attributor) -> None:
        self.probe = probe
        self.sink = open(os.devnull, "w")  # noqa: SIM115 - closed in stop()
        self.delivered_count = 0
        self.aggregated_count = 0
        self.dropped_count = 0
        self.overrun_count = 0
        self.reasons: dict[str, int] = {}
        self.deaths_delivered = 0
        self.deaths_aggregated = 0
        self.death_reasons: dict[str, int] = {}
        self.pipeline = NodePipeline(
            FileDiagnoser.for_host(attributor),
            Printer(self.sink, as_json=True),
            epoch_offset=boot_to_epoch_offset(),
            attributor=attributor,
            observer=self,
        )
        probe.open_ring_buffer(self.pipeline.on_record)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self.pipeline.run, args=(probe, self._stop), daemon=True
        )
        self._thread.start()

    def delivered(
        self, err: int | str, reason: Reason, *, aggregated: bool, count: int = 1
    ) -> None:
        if err in (errno.ENOEXEC, "ENOEXEC"):
            self.delivered_count += count
            self.aggregated_count += count if aggregated else 0
            self.reasons[str(reason)] = self.reasons.get(str(reason), 0) + count
        elif err == "EXIT127":
            self.deaths_delivered += count
            self.deaths_aggregated += count if aggregated else 0
            self.death_reasons[str(reason)] = self.death_reasons.get(str(reason), 0) + count

    def dropped(self, kind: str, count: int = 1) -> None:
        self.dropped_count += count

    def overran(self, stage: str) -> None:
        self.overrun_count += 1

    def drain(self) -> None:
        time.sleep(0.5)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sink.close()


def per_exec(before: tuple[int, int], after: tuple[int, int]) -> dict[str, float]:
    ns, cnt = after[0] - before[0], after[1] - before[1]
    return {"runs": cnt, "ns": ns, "ns_per_run": round(ns / cnt, 1) if cnt else 0.0}


def host_failures(probe: Probe) -> int:
    return sum(probe.errno_totals().values())


def kernel_cost(
    probe: Probe, gen: Path, cgroup: Path, args: argparse.Namespace
) -> dict[str, object]:
    fds = probe.program_fds()
    ours = fdinfo_prog_id(fds["exit_execve"])
    exits = fdinfo_prog_id(fds["enter_exit_group"])
    signals = fdinfo_prog_id(fds["signal_deliver"])
    result: dict[str, object] = {}
    with bpftrace_one_liner() as theirs, return_only_program(gen.parent) as baseline:
        progs = {
            "execwatch": ours,
            "bpftrace_one_liner": theirs,
            "return_only": baseline,
            "execwatch_exit_group": exits,
            "execwatch_signal_deliver": signals,
        }
        for phase, argv in (
            ("successful_exec", [str(gen), "success", str(args.success_execs)]),
            ("failing_exec", [str(gen), "fail", str(FOREIGN), str(args.fail_execs)]),
        ):
            result[phase] = measure(probe, progs, cgroup, argv)
        # Other engineers' failed execs land in the success phase and cost the failure
        # path: rounds with none of them measure the success path alone.
        rounds = [
            measure(probe, progs, cgroup, [str(gen), "success", str(args.success_execs // 10)])
            for _ in range(10)
        ]
        clean = [r for r in rounds if r["failed_execs_on_host"] == 0]
        result["successful_exec_clean_rounds"] = {
            name: per_exec(
                (0, 0),
                (sum(r[name]["ns"] for r in clean), sum(r[name]["runs"] for r in clean)),
            )
            for name in progs
        } | {"rounds": len(clean), "of": len(rounds)}
    result["successful_exec_corrected_ns"] = corrected_success_cost(result)
    ok = result["successful_exec"]
    clean_ok = result["successful_exec_clean_rounds"]
    assert isinstance(ok, dict) and isinstance(clean_ok, dict)
    ours_ns, base = clean_ok["execwatch"]["ns_per_run"], clean_ok["return_only"]["ns_per_run"]
    result["successful_exec_vs_return_only"] = round(ours_ns / base, 2) if base else None
    result["kernel_ns_per_process_exit"] = ok["execwatch_exit_group"]["ns_per_run"]
    return result


def measure(probe: Probe, progs: dict[str, int], cgroup: Path, argv: list[str]) -> dict[str, Any]:
    failures_before = host_failures(probe)
    before = {name: prog_stats(i) for name, i in progs.items()}
    run_in(cgroup, argv)
    after = {name: prog_stats(i) for name, i in progs.items()}
    return {name: per_exec(before[name], after[name]) for name in progs} | {
        "failed_execs_on_host": host_failures(probe) - failures_before
    }


def corrected_success_cost(result: dict[str, object]) -> float:
    """Other processes' failed execs land in the success phase too (each costing the failure
    path); remove them using the failure phase's per-run cost."""
    ok = result["successful_exec"]
    fail = result["failing_exec"]
    assert isinstance(ok, dict) and isinstance(fail, dict)
    ours = ok["execwatch"]
    n_fail = ok["failed_execs_on_host"]
    clean_runs = ours["runs"] - n_fail
    clean_ns = ours["ns"] - n_fail * fail["execwatch"]["ns_per_run"]
    return round(clean_ns / clean_runs, 1) if clean_runs > 0 else 0.0


def fdinfo_prog_id(fd: int) -> int:
    for line in Path(f"/proc/self/fdinfo/{fd}").read_text().splitlines():
        if line.startswith("prog_id:"):
            return int(line.split()[1])
    raise RuntimeError("no prog_id in fdinfo")


def storm(
    probe: Probe, consumer: Consumer, gen: Path, cgroup: Path, args: argparse.Namespace
) -> dict[str, object]:
    cg_id = os.stat(cgroup).st_ino
    kernel_before = probe.counts_by_cgroup().get((cg_id, errno.ENOEXEC), 0)
    drops_before = probe.stats()["ringbuf_full"]
    delivered_before, aggregated_before = consumer.delivered_count, consumer.aggregated_count
    cpu_before = resource.getrusage(resource.RUSAGE_SELF).ru_utime
    t0 = time.monotonic()
    caused = run_in(
        cgroup,
        [str(gen), "storm", str(args.storm_rate), str(args.storm_seconds), str(FOREIGN)],
    )
    elapsed = time.monotonic() - t0
    consumer.drain()
    cpu = resource.getrusage(resource.RUSAGE_SELF).ru_utime - cpu_before
    kernel = probe.counts_by_cgroup().get((cg_id, errno.ENOEXEC), 0) - kernel_before
    delivered = consumer.delivered_count - delivered_before
    dropped = probe.stats()["ringbuf_full"] - drops_before
    rss, peak = rss_mb()
    return {
        "failures_caused": caused,
        "seconds": round(elapsed, 2),
        "rate_per_s": round(caused / elapsed),
        "kernel_count": kernel,
        "kernel_count_exact": kernel == caused,
        "delivered": delivered,
        "aggregated": consumer.aggregated_count - aggregated_before,
        "dropped_ringbuf_full": dropped,
        "delivered_plus_dropped_equals_kernel": delivered + dropped == kernel,
        "agent_user_cpu_s": round(cpu, 3),
        "agent_user_cpu_us_per_delivered_event": round(cpu * 1e6 / delivered, 2)
        if delivered
        else None,
        "agent_rss_mb": round(rss, 1),
        "agent_peak_rss_mb": round(peak, 1),
    }


def idle_cpu_per_s(seconds: float = 3.0) -> float:
    """The agent's user CPU with nothing to do (poll loop, attribution's watchers)."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_utime
    time.sleep(seconds)
    return (resource.getrusage(resource.RUSAGE_SELF).ru_utime - before) / seconds


def death_storm(
    probe: Probe, consumer: Consumer, gen: Path, cgroup: Path, args: argparse.Namespace
) -> dict[str, object]:
    dies = dying_binary(gen.parent)
    idle = idle_cpu_per_s()
    kernel_before = probe.death_totals().get("EXIT127", 0)
    drops_before = probe.stats()["death_ringbuf_full"]
    delivered_before, aggregated_before = consumer.deaths_delivered, consumer.deaths_aggregated
    cpu_before = resource.getrusage(resource.RUSAGE_SELF).ru_utime
    t0 = time.monotonic()
    caused = run_in(
        cgroup, [str(gen), "deaths", str(args.death_rate), str(args.death_seconds), str(dies)]
    )
    elapsed = time.monotonic() - t0
    consumer.drain()
    cpu = resource.getrusage(resource.RUSAGE_SELF).ru_utime - cpu_before
    kernel = probe.death_totals().get("EXIT127", 0) - kernel_before
    delivered = consumer.deaths_delivered - delivered_before
    dropped = probe.stats()["death_ringbuf_full"] - drops_before
    return {
        "deaths_caused": caused,
        "seconds": round(elapsed, 2),
        "rate_per_s": round(caused / elapsed),
        "kernel_count_exit127_host": kernel,
        "kernel_count_exact": kernel == caused,
        "delivered": delivered,
        "aggregated": consumer.deaths_aggregated - aggregated_before,
        "dropped_ringbuf_full": dropped,
        "agent_user_cpu_s": round(cpu, 3),
        "agent_user_cpu_us_per_delivered_event": round(cpu * 1e6 / delivered, 2)
        if delivered
        else None,
        "agent_idle_user_cpu_per_s": round(idle, 4),
        "agent_user_cpu_us_per_delivered_event_minus_idle": round(
            max(cpu - idle * elapsed, 0) * 1e6 / delivered, 2
        )
        if delivered
        else None,
        "diagnosis": dict(consumer.death_reasons),
    }


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--success-execs", type=int, default=3000)
    parser.add_argument("--fail-execs", type=int, default=30000)
    parser.add_argument("--storm-rate", type=int, default=12000)
    parser.add_argument("--storm-seconds", type=float, default=10)
    parser.add_argument("--death-rate", type=int, default=1000)
    parser.add_argument("--death-seconds", type=float, default=10)
    args = parser.parse_args(argv)
    require_root()
    if not FOREIGN.exists() or not shutil.which("bpftrace"):
        raise SystemExit("needs dev/fetch-foreign.sh and bpftrace (make setup-test)")
    with (
        tempfile.TemporaryDirectory() as tmp,
        sysctl("kernel.bpf_stats_enabled", "1"),
        own_cgroup(f"execwatch-bench-{os.getpid()}") as cgroup,
        Probe(ProbeOptions()) as probe,
        Attributor() as attributor,
    ):
        gen = build_c("execgen.c", Path(tmp))
        consumer = Consumer(probe, attributor)
        try:
            result: dict[str, object] = {"kernel_cost": kernel_cost(probe, gen, cgroup, args)}
            result["storm"] = storm(probe, consumer, gen, cgroup, args)
            result["early_death_storm"] = death_storm(probe, consumer, gen, cgroup, args)
        finally:
            consumer.stop()
        result["diagnosis_of_storm_events"] = consumer.reasons
    print(json.dumps(result, indent=2))
    print(f"saved {save('probe', result)}")
    return result


if __name__ == "__main__":
    main()
