"""Kernel and agent cost of the probe, side by side with the seed's bpftrace one-liner.

    .venv/bin/python -m benchmarks.probe_bench [--storm-rate 12000 --storm-seconds 10]
        [--phases kernel,storm,deaths,search]

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
   returns (benchmarks/return_only.bpf.c) on the same tracepoint. Programs on one
   tracepoint run in the order they were attached, and the first ones pay more (cold
   lines: a return-only program measured 80-95 ns first and 51-55 ns last here), so the
   batches run twice, once in each order, and the figures add both.
4. An early-death storm: --death-rate processes per second for --death-seconds, each a
   real binary whose DT_NEEDED library was deleted, so glibc's loader exits 127. Reports
   the kernel's exact count, delivered / folded, and agent user CPU per delivered event.
5. PATH-search noise: --search-rate execvp-style searches per second for --search-seconds
   (four PATH directories lack the program, the fifth has it), once with the kernel's
   folding off and once on, each with a fresh probe and the pipeline (no attribution).
   Reports the agent's CPU per miss (all its threads, from the scheduler's exact
   runtime), raw, net of the idle agent over as long a time, and net of the same storm of
   execs without a search; the exact counts (records sent + repeats folded = the kernel's
   count); and the kernel time per miss from ten short rounds of each case, kept when no
   other process failed an exec meanwhile, every successful exec taken off at its cost
   in the storm without a search.
6. The per-cgroup budget (--phases budget): exit_execve's kernel time per failing exec
   (ENOEXEC: each one reaches the budget) in --budget-rounds rounds of --budget-execs,
   of two variants attached together, in both orders: the object before the budget
   (--old-object, built from git), the budget off, on but never reached (each failure
   pays the bucket check and sends its record), and the default budget, which such a
   storm goes over (the shed path: no record).
7. Silent emulation (--phases emulation): the success path's kernel time with and without
   a foreign binfmt_misc entry. Debian's qemu-aarch64-static is registered in a private
   user namespace's binfmt_misc, as the tests register it, and the probe reads that table
   as a node's: the sched_process_exec program is attached (an arm64 busybox run through
   it must be counted) and measured per successful native exec next to a return-only
   program on the same hook, --emulation-execs in twenty rounds whose attach orders
   alternate; then the entry is removed, the program detached, and the failure probe
   alone (exit_execve) measured again: the emulation program must not run at all.
8. A host without any binfmt_misc registration (--phases unregistered --old-rev REV):
   the object of git revision REV (built here, as `make bpf` builds it) and this one,
   each loaded by this probe and attached together, in --unregistered-rounds rounds whose
   attach orders alternate; per round, --unregistered-execs successful execs then as many
   failing ones. Each object's kernel time per exec is the sum over all its programs but
   the mount watch (exit_group and signal hooks included) over its exit_execve's run count
   (every execve on the host runs it once); the ratio this / REV is the added cost, over
   the pairs of rounds (one in each attach order) in which neither emulation program ran
   (another process may register a foreign entry in its namespace meanwhile, which this
   probe then watches). `--old-rev HEAD` (this object twice) gives the noise. The
   binfmt_misc mount watch runs only on mount(2) and fsopen(2), which the execs never
   call, by any process on the host meanwhile (other engineers' containers): its runs and
   ns per run are given apart.

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
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.binfmt.emulation import EMULATORS, BinfmtNamespace, aarch64_entry

from benchmarks.common import build_c, require_root, rss_mb, save, sysctl
from execwatch.attribution import Attributor
from execwatch.attribution.mounts import cgroup_mounts
from execwatch.node.output import Printer
from execwatch.node.stack import NodeStack, StackOptions
from execwatch.pipeline import KernelFolds
from execwatch.probe import Probe, layout
from execwatch.probe.libbpf import RingBufferCallback, load_libbpf
from execwatch.probe.loader import ProbeOptions
from execwatch.record import Reason

ONE_LINER = (
    "tracepoint:syscalls:sys_exit_execve /args->ret == -8/ "
    '{ printf("Exec format error detected for PPID %d\\n", curtask->real_parent->pid); }'
)
BPFTRACE_PROG = "sys_exit_execve"  # what bpftrace names the one-liner's program
FOREIGN = Path(__file__).resolve().parent.parent / ".cache/foreign/arm64/root/usr/bin/hello"
HERE = Path(__file__).resolve().parent
HEAD_KIND_CGROUP = layout.head_picker("kind", "cgroup_id")  # the same in every record


def multiarch() -> str:
    out = subprocess.run(["gcc", "-print-multiarch"], capture_output=True, text=True)
    return out.stdout.strip() or f"{os.uname().machine}-linux-gnu"


def attach_in_order(stack: ExitStack, tmp: Path, order: str) -> tuple[Probe, int]:
    """execwatch's probe and the return-only program (its prog id) on the same tracepoint,
    attached in `order`: programs run in attach order, and the first one pays more."""
    baseline = None
    if order == "return_only_first":
        baseline = stack.enter_context(return_only_program(tmp))
    probe = stack.enter_context(Probe())
    if order == "execwatch_first":
        baseline = stack.enter_context(return_only_program(tmp))
    if baseline is None:
        raise ValueError(f"unknown attach order {order!r}")
    return probe, baseline


@dataclass
class Loaded:
    """A program loaded through libbpf and not attached yet."""

    lib: ctypes.CDLL
    prog: int

    @property
    def prog_id(self) -> int:
        return fdinfo_prog_id(self.lib.bpf_program__fd(self.prog))

    @contextmanager
    def attached(self) -> Iterator[None]:
        """Attached (after every program already on its hook) while in the block."""
        link = self.lib.bpf_program__attach(self.prog)
        if not link:
            raise RuntimeError(f"cannot attach return_only: errno {ctypes.get_errno()}")
        try:
            yield
        finally:
            self.lib.bpf_link__destroy(link)


@contextmanager
def return_only_loaded(tmp: Path, source: Path | None = None) -> Iterator[Loaded]:
    """Build and load benchmarks/return_only.bpf.c (or `source`) through libbpf."""
    source = source or HERE / "return_only.bpf.c"
    obj_path = tmp / f"{source.name.removesuffix('.c')}.o"
    include = f"-I/usr/include/{multiarch()}"
    subprocess.run(
        ["clang", "-O2", "-target", "bpf", include, "-c", source, "-o", obj_path], check=True
    )
    lib = load_libbpf()
    obj = lib.bpf_object__open_file(str(obj_path).encode(), None)
    try:
        if not obj or lib.bpf_object__load(obj) < 0:
            raise RuntimeError("cannot load the return-only program")
        yield Loaded(lib, lib.bpf_object__next_program(obj, None))
    finally:
        lib.bpf_object__close(obj)


@contextmanager
def return_only_program(tmp: Path, source: Path | None = None) -> Iterator[int]:
    """return_only_loaded's program, attached; yield its prog id."""
    with return_only_loaded(tmp, source) as loaded, loaded.attached():
        yield loaded.prog_id


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


def tracepoint_prog_ids(name: str) -> set[int]:
    """By name too: other engineers' tests load and unload their probes meanwhile."""
    out = subprocess.run([bpftool(), "prog", "show", "-j"], check=True, capture_output=True)
    return {
        p["id"]
        for p in json.loads(out.stdout)
        if p.get("type") == "tracepoint" and p.get("name") == name
    }


@contextmanager
def bpftrace_one_liner() -> Iterator[int]:
    before = tracepoint_prog_ids(BPFTRACE_PROG)
    proc = subprocess.Popen(
        [shutil.which("bpftrace") or "bpftrace", "-e", ONE_LINER], stdout=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 60
        while not (new := tracepoint_prog_ids(BPFTRACE_PROG) - before):
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


def run_in(cgroup: Path, argv: list[str], env: dict[str, str] | None = None) -> int:
    """Run argv inside cgroup; return the failed-exec count it prints."""
    out = subprocess.run(
        argv,
        check=True,
        capture_output=True,
        text=True,
        env=env,
        preexec_fn=lambda: (cgroup / "cgroup.procs").write_text(str(os.getpid())),
    )
    return int(out.stdout.strip() or 0)


class Consumer:
    """The agent's node stack, run on a thread like `execwatch trace` runs it."""

    probe: Probe

    def __init__(self, watch_cgroup: int = 0) -> None:
        self.watch_cgroup = watch_cgroup  # records sent and repeats folded for it, counted
        self.records = 0  # every record, the host's other processes' too
        self.watched_records = 0
        self.watched_deaths = 0
        self.watched_folds = 0
        self.delivered_count = 0
        self.aggregated_count = 0
        self.dropped_count = 0
        self.overrun_count = 0
        self.reasons: dict[str, int] = {}
        self.deaths_delivered = 0
        self.deaths_aggregated = 0
        self.death_reasons: dict[str, int] = {}
        self.not_found_reasons: dict[str, int] = {}
        self._folds: KernelFolds | None = None
        self._stop = threading.Event()

    @classmethod
    @contextmanager
    def open(
        cls,
        attributor: Attributor | None,
        probe: ProbeOptions | None = None,
        *,
        watch_cgroup: int = 0,
        kernel_folds: bool = True,
    ) -> Iterator[Consumer]:
        """The stack (its pipeline's window, 1 s, is the kernel's fold window too) into
        JSON lines on /dev/null; on exit the consume loop ends with its last flush."""
        consumer = cls(watch_cgroup)
        options = StackOptions(
            probe=probe or ProbeOptions(),
            kernel_folds=kernel_folds,
            attributor=attributor,
            observer=consumer,
            folds=consumer.watch_folds,
            tap=consumer.on_record if watch_cgroup else None,
        )
        with (
            open(os.devnull, "w") as sink,
            NodeStack.open(options, Printer(sink, as_json=True)) as stack,
        ):
            consumer.probe = stack.probe
            thread = threading.Thread(target=stack.run, args=(consumer._stop,), daemon=True)
            thread.start()
            try:
                yield consumer
            finally:
                consumer._stop.set()
                thread.join()

    def delivered(
        self,
        err: int | str,
        reason: Reason,
        *,
        aggregated: bool,
        count: int = 1,
        cause: object = None,
    ) -> None:
        if err in (errno.ENOEXEC, "ENOEXEC"):
            self.delivered_count += count
            self.aggregated_count += count if aggregated else 0
            self.reasons[str(reason)] = self.reasons.get(str(reason), 0) + count
        elif err in (errno.ENOENT, "ENOENT"):
            self.not_found_reasons[str(reason)] = self.not_found_reasons.get(str(reason), 0) + count
        elif err == "EXIT127":
            self.deaths_delivered += count
            self.deaths_aggregated += count if aggregated else 0
            self.death_reasons[str(reason)] = self.death_reasons.get(str(reason), 0) + count

    def on_record(self, raw: bytes, on_record: Callable[[bytes], None]) -> None:
        self.records += 1
        kind, cgroup = HEAD_KIND_CGROUP.unpack_from(raw)
        if kind == layout.KIND_EXEC_FAILED:
            self.watched_records += cgroup == self.watch_cgroup
        else:
            self.watched_deaths += cgroup == self.watch_cgroup
        on_record(raw)

    def watch_folds(self, probe: Probe) -> Consumer:
        self._folds = probe
        return self

    def take_folds(self) -> dict[layout.FoldedName, int]:
        assert self._folds is not None
        folds = self._folds.take_folds()
        self.watched_folds += sum(n for name, n in folds.items() if name[0] == self.watch_cgroup)
        return folds

    def dropped(self, kind: str, count: int = 1) -> None:
        self.dropped_count += count

    def overran(self, stage: str) -> None:
        self.overrun_count += 1

    def drain(self) -> None:
        time.sleep(1.5)  # past the pipeline's next flush (1 s), which takes the kernel's folds


def per_exec(before: tuple[int, int], after: tuple[int, int]) -> dict[str, float]:
    ns, cnt = after[0] - before[0], after[1] - before[1]
    return {"runs": cnt, "ns": ns, "ns_per_run": round(ns / cnt, 1) if cnt else 0.0}


def host_failures(probe: Probe) -> int:
    return sum(probe.errno_totals().values())


ORDERS = ("execwatch_first", "return_only_first")


@contextmanager
def drained(probe: Probe) -> Iterator[None]:
    """Consume (and drop) the probe's records on a thread: with a full ring buffer the
    failure path would skip its record and look cheaper than it is."""
    probe.open_ring_buffer(lambda raw: None)
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            probe.poll(50)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def kernel_cost(gen: Path, cgroup: Path, args: argparse.Namespace) -> dict[str, object]:
    """Both attach orders, each with a fresh probe; the figures add both orders up."""
    by_order = {order: kernel_cost_in_order(order, gen, cgroup, args) for order in ORDERS}
    result: dict[str, object] = {}
    for phase in ("successful_exec", "failing_exec", "successful_exec_clean_rounds"):
        parts = [by_order[o][phase] for o in ORDERS]
        result[phase] = {name: add_up([p[name] for p in parts]) for name in PROGRAMS}
    clean = result["successful_exec_clean_rounds"]
    assert isinstance(clean, dict)
    clean["rounds"] = sum(by_order[o]["rounds"] for o in ORDERS)
    clean["of"] = sum(by_order[o]["of"] for o in ORDERS)
    ours, base = clean["execwatch"]["ns_per_run"], clean["return_only"]["ns_per_run"]
    result["successful_exec_vs_return_only"] = round(ours / base, 2) if base else None
    result["kernel_ns_per_process_exit"] = clean["execwatch_exit_group"]["ns_per_run"]
    result["by_attach_order"] = by_order
    return result


PROGRAMS = (
    "execwatch",
    "bpftrace_one_liner",
    "return_only",
    "execwatch_exit_group",
    "execwatch_signal_deliver",
)


def kernel_cost_in_order(
    order: str, gen: Path, cgroup: Path, args: argparse.Namespace
) -> dict[str, Any]:
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        probe, baseline = attach_in_order(stack, tmp, order)
        theirs = stack.enter_context(bpftrace_one_liner())
        stack.enter_context(drained(probe))
        fds = probe.program_fds()
        progs = {
            "execwatch": fdinfo_prog_id(fds["exit_execve"]),
            "bpftrace_one_liner": theirs,
            "return_only": baseline,
            "execwatch_exit_group": fdinfo_prog_id(fds["enter_exit_group"]),
            "execwatch_signal_deliver": fdinfo_prog_id(fds["signal_deliver"]),
        }
        result: dict[str, Any] = {}
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
            name: add_up([r[name] for r in clean]) for name in progs
        }
        result["rounds"], result["of"] = len(clean), len(rounds)
    return result


def add_up(parts: list[dict[str, Any]]) -> dict[str, float]:
    return per_exec((0, 0), (sum(p["ns"] for p in parts), sum(p["runs"] for p in parts)))


def measure(probe: Probe, progs: dict[str, int], cgroup: Path, argv: list[str]) -> dict[str, Any]:
    failures_before = host_failures(probe)
    before = {name: prog_stats(i) for name, i in progs.items()}
    run_in(cgroup, argv)
    after = {name: prog_stats(i) for name, i in progs.items()}
    return {name: per_exec(before[name], after[name]) for name in progs} | {
        "failed_execs_on_host": host_failures(probe) - failures_before
    }


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
    ours_before = consumer.watched_records
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
        # delivered and dropped are host-wide: other processes' ENOEXEC land there too
        "delivered_plus_dropped_equals_kernel": delivered + dropped == kernel,
        "records_from_the_cgroup": consumer.watched_records - ours_before,
        "records_from_the_cgroup_exact": consumer.watched_records - ours_before == kernel,
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
    ours_before = consumer.watched_deaths
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
    ours = consumer.watched_deaths - ours_before
    return {
        "deaths_caused": caused,
        "seconds": round(elapsed, 2),
        "rate_per_s": round(caused / elapsed),
        # death_totals is per status, host-wide: other processes' loader exits land in it
        "kernel_count_exit127_host": kernel,
        "kernel_count_at_least_caused": kernel >= caused,
        "records_from_the_cgroup": ours,
        "records_from_the_cgroup_exact": ours == caused,
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


SEARCH_NAME = "ewprog"
SEARCH_MISSES = 4  # the issue's execvp search: four PATH directories lack the program


def search_dirs(tmp: Path) -> list[Path]:
    """SEARCH_MISSES + 1 PATH directories; only the last holds the program (a copy of
    /bin/true)."""
    dirs = [tmp / "path" / f"d{i}" for i in range(SEARCH_MISSES + 1)]
    for d in dirs:
        d.mkdir(parents=True)
    shutil.copy("/bin/true", dirs[-1] / SEARCH_NAME)
    return dirs


def path_search(gen: Path, cgroup: Path, args: argparse.Namespace) -> dict[str, object]:
    """The same search storm with the kernel's folding off, then on. Without attribution:
    it runs once per name either way, and the inventory's work on other engineers'
    cgroups would be noise in a figure of about a microsecond."""
    dirs = search_dirs(gen.parent)
    result: dict[str, object] = {}
    for label, folds in (("fold_off", False), ("fold_on", True)):
        with return_only_program(gen.parent) as baseline:
            before = prog_stats(baseline)
            storm = search_storm(folds, gen, cgroup, dirs, args)
            # The empty program's cost per run in the same storm: what cold caches cost
            storm["return_only"] = per_exec(before, prog_stats(baseline))
            result[label] = storm
    return result


def fd_stats(fd: int) -> tuple[int, int]:
    """(run_time_ns, run_cnt) of one of our programs from /proc/self/fdinfo: no bpftool
    process, whose fork would land in the agent's CPU figure."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/self/fdinfo/{fd}").read_text().splitlines()
    )
    return int(fields.get("run_time_ns", 0)), int(fields.get("run_cnt", 0))


def agent_phase(
    consumer: Consumer, cgroup: Path, argv: list[str], env: dict[str, str] | None = None
) -> dict[str, Any]:
    """One generator run and the pipeline's drain after it: the count the generator printed,
    the agent's CPU (every thread, user + system, from the scheduler's exact runtime, not
    the tick-sampled rusage) and the wall time."""
    cpu, t0 = time.process_time(), time.monotonic()
    records, ours = consumer.records, consumer.watched_records + consumer.watched_deaths
    n = run_in(cgroup, argv, env)
    consumer.drain()
    ours = consumer.watched_records + consumer.watched_deaths - ours
    theirs = consumer.records - records - ours
    return {
        "n": n,
        "cpu_s": time.process_time() - cpu,
        "wall_s": time.monotonic() - t0,
        "records_from_other_processes": theirs,  # the agent serves the whole host
    }


def exec_rounds(
    probe: Probe,
    cgroup: Path,
    argv: list[str],
    rounds: int,
    misses_per_n: int,
    env: dict[str, str] | None,
) -> list[tuple[dict[str, Any], bool]]:
    """exit_execve's bpf_stats over each of `rounds` runs of argv, with the misses the run
    caused, and whether it was clean: no other process failed an exec meanwhile.
    bpf_stats and errno_totals are host-wide, and another engineer's failed exec costs
    microseconds. Others' successful execs cost what ours do."""
    prog_fd = probe.program_fds()["exit_execve"]
    out = []
    for _ in range(rounds):
        before, failures = fd_stats(prog_fd), host_failures(probe)
        misses = misses_per_n * run_in(cgroup, argv, env)
        stats = per_exec(before, fd_stats(prog_fd)) | {"misses": misses}
        out.append((stats, host_failures(probe) - failures == misses))
    return out


def kernel_rounds(
    probe: Probe, cgroup: Path, argv: list[str], misses_per_n: int, env: dict[str, str] | None
) -> dict[str, Any]:
    """The exec program's time in ten short runs of argv, all of them and the clean ones."""
    rounds = exec_rounds(probe, cgroup, argv, 10, misses_per_n, env)
    clean = [stats for stats, ok in rounds if ok]
    return {
        "all": add_up([stats for stats, _ in rounds])
        | {"misses": sum(stats["misses"] for stats, _ in rounds)},
        "clean": add_up(clean) | {"misses": sum(stats["misses"] for stats in clean)},
        "clean_rounds": len(clean),
    }


def per_miss_ns(misses: dict[str, Any], success_ns: float) -> float | None:
    """exit_execve's time per miss: its time less every successful exec's (the hits, the
    generator's own exec, others'), at the successful exec's cost in the storm."""
    n, runs = misses["misses"], misses["runs"]
    return round((misses["ns"] - (runs - n) * success_ns) / n, 1) if n and success_ns else None


def search_storm(
    kernel_folds: bool, gen: Path, cgroup: Path, dirs: list[Path], args: argparse.Namespace
) -> dict[str, Any]:
    """In one probe and pipeline: the agent idle for as long as a storm lasts, the search
    storm, then the same fork/exec/exit storm without a search (the program by its path):
    what the agent spends idle, and anyway while the machine forks that hard. Then the
    kernel's cost in short rounds of each, kept when no other exec ran meanwhile."""
    cg_id = os.stat(cgroup).st_ino
    rate, secs = str(args.search_rate), str(args.search_seconds)
    program = str(dirs[-1] / SEARCH_NAME)
    missing = str(dirs[0] / SEARCH_NAME)
    env = {"PATH": ":".join(map(str, dirs))}
    with Consumer.open(None, watch_cgroup=cg_id, kernel_folds=kernel_folds) as consumer:
        probe = consumer.probe
        # One process missing one name over and over: the same path, warm caches.
        warm = agent_phase(consumer, cgroup, [str(gen), "storm", "10000", "3", missing])
        idle = agent_phase(consumer, cgroup, [str(gen), "run", "0", secs, program])
        sent_before, folded_before = consumer.watched_records, consumer.watched_folds
        kernel_before = probe.counts_by_cgroup().get((cg_id, errno.ENOENT), 0)
        drops_before = probe.stats()["ringbuf_full"]
        search = agent_phase(consumer, cgroup, [str(gen), "search", rate, secs, SEARCH_NAME], env)
        sent = consumer.watched_records - sent_before
        folded = consumer.watched_folds - folded_before
        kernel = probe.counts_by_cgroup().get((cg_id, errno.ENOENT), 0) - kernel_before
        drops = probe.stats()["ringbuf_full"] - drops_before
        runs = agent_phase(consumer, cgroup, [str(gen), "run", rate, secs, program])
        short = str(args.search_seconds / 10)
        warm_argv = [str(gen), "storm", "10000", "0.3", missing]
        k_warm = kernel_rounds(probe, cgroup, warm_argv, 1, None)
        k_search = kernel_rounds(
            probe, cgroup, [str(gen), "search", rate, short, SEARCH_NAME], SEARCH_MISSES, env
        )
        k_runs = kernel_rounds(probe, cgroup, [str(gen), "run", rate, short, program], 0, None)
    # (its consume loop's last flush took the kernel's last folds)
    searches = search["n"]
    misses = SEARCH_MISSES * searches
    per_miss = 1e6 / misses if misses else 0.0
    idle_rate = idle["cpu_s"] / idle["wall_s"]
    success_ns = k_runs["clean"]["ns_per_run"] or k_runs["all"]["ns_per_run"]
    return {
        "searches_that_ran_the_program": searches,
        "misses_caused": misses,
        "seconds": round(search["wall_s"], 2),
        "misses_per_s": round(misses / search["wall_s"]),
        "kernel_count_enoent": kernel,
        "kernel_count_exact": kernel == misses,
        "records_sent": sent,
        "folded_in_kernel": folded,
        "dropped_ringbuf_full_host": drops,
        "sent_plus_folded_equals_kernel": sent + folded == kernel,
        "agent_idle_cpu_ms_per_s": round(idle_rate * 1e3, 3),
        "records_from_other_processes": {
            "idle": idle["records_from_other_processes"],
            "search": search["records_from_other_processes"],
            "warm": warm["records_from_other_processes"],
        },
        "agent_cpu_s": round(search["cpu_s"], 4),
        "agent_cpu_us_per_miss": round(search["cpu_s"] * per_miss, 3),
        "agent_cpu_us_per_miss_net_of_idle": round(
            (search["cpu_s"] - idle_rate * search["wall_s"]) * per_miss, 3
        ),
        "runs_without_search": runs["n"],
        "agent_cpu_s_without_search": round(runs["cpu_s"], 4),
        "agent_cpu_us_per_miss_net_of_runs": round(
            (search["cpu_s"] - runs["cpu_s"] * searches / runs["n"]) * per_miss, 3
        )
        if runs["n"]
        else None,
        "diagnosis": dict(consumer.not_found_reasons),
        "warm_misses": warm["n"],
        "warm_agent_cpu_us_per_miss": round(warm["cpu_s"] * 1e6 / warm["n"], 3)
        if warm["n"]
        else None,
        "warm_agent_cpu_us_per_miss_net_of_idle": round(
            (warm["cpu_s"] - idle_rate * warm["wall_s"]) * 1e6 / warm["n"], 3
        )
        if warm["n"]
        else None,
        "kernel_rounds": {"warm": k_warm, "search": k_search, "without_search": k_runs},
        "kernel_ns_per_successful_exec_in_storm": success_ns,
        "kernel_ns_per_miss": per_miss_ns(k_search["clean"], success_ns),
        "kernel_ns_per_miss_all_rounds": per_miss_ns(k_search["all"], success_ns),
        "warm_kernel_ns_per_miss": per_miss_ns(k_warm["clean"], success_ns),
        "warm_kernel_ns_per_miss_all_rounds": per_miss_ns(k_warm["all"], success_ns),
    }


BUDGET_VARIANTS = {  # ProbeOptions' budget fields of each variant of the new object
    "budget_off": {"budget_rate": 0.0},
    "budget_never_reached": {"budget_rate": 1e9, "budget_burst": 10**6},
    "budget_default_shedding": {},
}


@contextmanager
def old_object(path: Path) -> Iterator[int]:
    """An object from before the budget, loaded as its loader did (the wakeup interval and
    fold window set in .rodata, a 4 MiB ring drained on a thread); its exit_execve's fd."""
    lib = load_libbpf()
    obj = lib.bpf_object__open_file(str(path).encode(), None)
    if not obj:
        raise SystemExit(f"cannot open {path}")
    links: list[int] = []
    ring, stop, thread = None, threading.Event(), None
    try:
        prog_fd = load_old_object(lib, obj, links)
        events = lib.bpf_object__find_map_by_name(obj, b"events")
        ring = lib.ring_buffer__new(lib.bpf_map__fd(events), DISCARD, None, None)
        thread = threading.Thread(target=poll_until, args=(lib, ring, stop), daemon=True)
        thread.start()
        yield prog_fd
    finally:
        stop.set()
        if thread is not None:
            thread.join()
        if ring:
            lib.ring_buffer__free(ring)
        for link in links:
            lib.bpf_link__destroy(link)
        lib.bpf_object__close(obj)


def load_old_object(lib: ctypes.CDLL, obj: int, links: list[int]) -> int:
    events = lib.bpf_object__find_map_by_name(obj, b"events")
    lib.bpf_map__set_max_entries(events, ProbeOptions().ringbuf_bytes)
    rodata = next(m for m in maps(lib, obj) if lib.bpf_map__name(m).endswith(b".rodata"))
    size = ctypes.c_size_t()
    initial = lib.bpf_map__initial_value(rodata, ctypes.byref(size))
    config = bytearray(ctypes.string_at(initial, size.value))
    for name, value in (("wakeup_interval_ns", 10**7), ("fold_window_ns", 10**9)):
        offset = getattr(layout.Config, name).offset  # the same before the budget fields
        config[offset : offset + 8] = value.to_bytes(8, "little")
    buf = ctypes.create_string_buffer(bytes(config), len(config))
    lib.bpf_map__set_initial_value(rodata, buf, len(config))
    if lib.bpf_object__load(obj) < 0:
        raise SystemExit("the kernel refused the old object")
    fds = {}
    prog = lib.bpf_object__next_program(obj, None)
    while prog:
        link = lib.bpf_program__attach(prog)
        if not link:
            raise SystemExit("cannot attach the old object")
        links.append(link)
        fds[lib.bpf_program__name(prog).decode()] = lib.bpf_program__fd(prog)
        prog = lib.bpf_object__next_program(obj, prog)
    return int(fds["exit_execve"])


def maps(lib: ctypes.CDLL, obj: int) -> Iterator[int]:
    m = lib.bpf_object__next_map(obj, None)
    while m:
        yield m
        m = lib.bpf_object__next_map(obj, m)


def poll_until(lib: ctypes.CDLL, ring: int, stop: threading.Event) -> None:
    while not stop.is_set() and lib.ring_buffer__poll(ring, 50) >= 0:
        pass


DISCARD = RingBufferCallback(lambda _ctx, _data, _size: 0)


@contextmanager
def budget_variant(name: str, old: Path | None) -> Iterator[int]:
    """The variant loaded and its ring drained; its exit_execve's fd."""
    if name == "old_object":
        assert old is not None
        with old_object(old) as fd:
            yield fd
        return
    with Probe(ProbeOptions(**BUDGET_VARIANTS[name])) as probe, drained(probe):  # type: ignore[arg-type]
        yield probe.program_fds()["exit_execve"]


BUDGET_PAIRS = (
    ("old_object", "budget_never_reached"),
    ("budget_off", "budget_never_reached"),
    ("old_object", "budget_default_shedding"),
)


def budget_cost(gen: Path, cgroup: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Pairs of variants attached together, so both run on every failing exec under the
    same load; each pair in both attach orders (the first program pays for cold lines),
    added up. Per pair: each one's ns per failing exec and the difference, per round."""
    pairs = [p for p in BUDGET_PAIRS if args.old_object or "old_object" not in p]
    argv = [str(gen), "fail", str(FOREIGN), str(args.budget_execs)]
    result: dict[str, Any] = {"failing_execs_per_round": args.budget_execs}
    for first, second in pairs:
        rounds = [
            budget_round((first, second), cgroup, argv, args) for _ in range(args.budget_rounds)
        ]
        diffs = [r[second] - r[first] for r in rounds]
        result[f"{second}_vs_{first}"] = {
            "ns_per_failing_exec_median": {
                v: round(statistics.median(r[v] for r in rounds), 1) for v in (first, second)
            },
            "difference_ns_median": round(statistics.median(diffs), 1),
            "difference_ns_rounds": [round(d, 1) for d in diffs],
        }
    return result


def budget_round(
    pair: tuple[str, str], cgroup: Path, argv: list[str], args: argparse.Namespace
) -> dict[str, float]:
    """Each variant's ns per failing exec over one run of argv in each attach order."""
    totals = {v: [0, 0] for v in pair}
    for order in (pair, pair[::-1]):
        with ExitStack() as stack:
            fds = {v: stack.enter_context(budget_variant(v, args.old_object)) for v in order}
            before = {v: fd_stats(fd) for v, fd in fds.items()}
            run_in(cgroup, argv)
            for v, fd in fds.items():
                ns, runs = fd_stats(fd)
                totals[v][0] += ns - before[v][0]
                totals[v][1] += runs - before[v][1]
    return {v: ns / runs if runs else 0.0 for v, (ns, runs) in totals.items()}


# The baseline of the emulation phase: a program that only returns, on the emulation
# program's own hook.
RETURN_ONLY_EXEC = """#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

SEC("tp_btf/sched_process_exec")
int return_only_exec(void *ctx)
{
	return 0;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
"""
BUSYBOX_ARM64 = FOREIGN.parent / "busybox"
EMULATOR_ENTRY = "qemu-aarch64"
EMULATION_ROUNDS = 20  # attach orders alternate round by round: the load drifts alike on both
EMULATION_PROGRAMS = ("emulated_exec", "return_only", "exit_execve")


def emulation_cost(gen: Path, cgroup: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The success path's kernel time with a foreign binfmt_misc entry (the emulation
    program attached, next to a return-only program on its hook, the two attach orders
    alternating round by round) and without one (the failure probe alone: the emulation
    program detached, never run)."""
    if not (EMULATORS / "qemu-aarch64-static").exists() or not BUSYBOX_ARM64.exists():
        raise SystemExit("needs dev/fetch-emulators.sh and dev/fetch-foreign.sh (make test)")
    execs = [str(gen), "success", str(args.emulation_execs // EMULATION_ROUNDS)]
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        source = tmp / "return_only_exec.bpf.c"
        source.write_text(RETURN_ONLY_EXEC)
        baseline = stack.enter_context(return_only_loaded(tmp, source))
        ns = BinfmtNamespace.start()
        stack.callback(ns.stop)
        ns.register(aarch64_entry(EMULATOR_ENTRY, EMULATORS / "qemu-aarch64-static", "F"))
        probe = stack.enter_context(Probe(ProbeOptions(binfmt_table=ns.table)))
        stack.enter_context(drained(probe))
        result: dict[str, Any] = {"emulated_execs_seen": emulated_exec_seen(probe, ns)}
        fds = probe.program_fds()
        progs = {
            "emulated_exec": fdinfo_prog_id(fds["emulated_exec"]),
            "return_only": baseline.prog_id,
            "exit_execve": fdinfo_prog_id(fds["exit_execve"]),
        }
        with_entry = [
            emulation_round(probe, baseline, ORDERS[i % len(ORDERS)], progs, cgroup, execs)
            for i in range(EMULATION_ROUNDS)
        ]
        ns.write(EMULATOR_ENTRY, "-1")
        probe.refresh_emulators()
        if probe.emulation_attached:
            raise RuntimeError("the emulation program stayed attached after the entry's removal")
        with baseline.attached():
            without = [measure(probe, progs, cgroup, execs) for _ in range(EMULATION_ROUNDS // 2)]
    return result | emulation_figures(with_entry, without)


def emulation_round(
    probe: Probe,
    baseline: Loaded,
    order: str,
    progs: dict[str, int],
    cgroup: Path,
    execs: list[str],
) -> dict[str, Any]:
    """One round of native execs with the emulation program (the entry's emulators) and
    the return-only program attached in `order`."""
    emulators = probe.binfmt_emulators()
    probe.set_emulators(())
    with ExitStack() as stack:
        if order == "return_only_first":
            stack.enter_context(baseline.attached())
        probe.set_emulators(emulators)
        if order == "execwatch_first":
            stack.enter_context(baseline.attached())
        return measure(probe, progs, cgroup, execs)


def emulation_figures(
    with_entry: list[dict[str, Any]], without: list[dict[str, Any]]
) -> dict[str, Any]:
    """Each program's time per exec over the rounds (exit_execve's over the rounds in which
    no other process failed an exec: each one costs it microseconds); the emulation
    program's time over the return-only one's, in all and per pair of rounds (one in each
    order)."""
    figures: dict[str, Any] = {}
    for case, rounds in (("with_foreign_entry", with_entry), ("without_foreign_entry", without)):
        clean = [r for r in rounds if r["failed_execs_on_host"] == 0]
        figures[case] = {n: add_up([r[n] for r in rounds]) for n in EMULATION_PROGRAMS[:2]}
        figures[case]["exit_execve"] = add_up([r["exit_execve"] for r in clean]) | {
            "rounds": len(clean)
        }
    attached = figures["with_foreign_entry"]
    ours, base = attached["emulated_exec"]["ns_per_run"], attached["return_only"]["ns_per_run"]
    figures["emulated_exec_ns_over_return_only"] = round(ours - base, 1)
    figures["over_return_only_per_pair_of_rounds"] = pair_gaps(with_entry)
    runs = figures["without_foreign_entry"]["emulated_exec"]["runs"]
    figures["emulated_exec_runs_without_foreign_entry"] = runs
    return figures


def pair_gaps(rounds: list[dict[str, Any]]) -> dict[str, float]:
    """The emulation program's time per exec over the return-only one's in each pair of
    consecutive rounds (one in each attach order): the spread within a run."""
    gaps = []
    for i in range(0, len(rounds) - 1, 2):
        ours, base = (add_up([r[n] for r in rounds[i : i + 2]]) for n in EMULATION_PROGRAMS[:2])
        gaps.append(ours["ns_per_run"] - base["ns_per_run"])
    return {
        "min": round(min(gaps), 1),
        "median": round(statistics.median(gaps), 1),
        "max": round(max(gaps), 1),
    }


def emulated_exec_seen(probe: Probe, ns: BinfmtNamespace) -> int:
    """The program measured is the one that works: arm64 busybox, run through the entry,
    is counted."""
    if not probe.emulation_attached:
        raise RuntimeError(f"the emulation program is not attached: {probe.emulation.unsupported}")
    before = probe.emulated_totals().get("arm64", 0)
    ran = ns.run(BUSYBOX_ARM64.resolve(), "true")
    seen = probe.emulated_totals().get("arm64", 0) - before
    if ran.returncode != 0 or seen != 1:
        raise RuntimeError(f"arm64 busybox under emulation: rc {ran.returncode}, counted {seen}")
    return seen


UNREGISTERED_PATHS = ("success", "fail")
MOUNT_WATCH = ("exit_mount", "exit_fsopen")  # this object's programs off the exec path
EMULATION = "emulated_exec"


def object_at(rev: str, tmp: Path) -> Path:
    """The BPF object of git revision `rev`, compiled as the Makefile compiles it."""
    src = tmp / f"bpf-{rev}"
    src.mkdir()
    for name in ("execwatch.bpf.c", "execwatch.h", "compat.bpf.h"):
        text = subprocess.run(
            ["git", "-C", str(HERE.parent), "show", f"{rev}:src/execwatch/bpf/{name}"],
            check=True,
            capture_output=True,
        ).stdout
        (src / name).write_bytes(text)
    out = src / "execwatch.bpf.o"
    arch = {"x86_64": "x86", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine)
    flags = ["-g", "-O2", "-target", "bpf", f"-D__TARGET_ARCH_{arch}"]
    include = [f"-I/usr/include/{multiarch()}", f"-I{src}"]
    subprocess.run(
        ["clang", *flags, *include, "-c", str(src / "execwatch.bpf.c"), "-o", str(out)],
        check=True,
    )
    return out


def unregistered_cost(gen: Path, cgroup: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The exec path's kernel time with no binfmt_misc registration anywhere: the object
    of --old-rev and this one, attached together, orders alternating round by round."""
    if not args.old_rev:
        raise SystemExit("--phases unregistered needs --old-rev REV (the object to compare)")
    n = str(args.unregistered_execs)
    argvs = {
        "success": [str(gen), "success", n],
        "fail": [str(gen), "fail", str(FOREIGN), n],
    }
    with tempfile.TemporaryDirectory() as tmp:
        old = object_at(args.old_rev, Path(tmp))
        variants = {"old": ProbeOptions(object_path=old), "this": ProbeOptions()}
        rounds = [
            unregistered_round(variants, i % 2 == 1, cgroup, argvs)
            for i in range(args.unregistered_rounds)
        ]
    result: dict[str, Any] = {"old_rev": args.old_rev, "execs_per_round": args.unregistered_execs}
    for path in UNREGISTERED_PATHS:
        pairs = [
            [r[path] for r in rounds[i : i + 2]]
            for i in range(0, len(rounds) - 1, 2)
            if all(r[path]["emulated_exec_runs"] == 0 for r in rounds[i : i + 2])
        ]
        ratios = [unregistered_ratio(pair) for pair in pairs]
        result[path] = {
            "pairs_of_rounds_without_emulation": len(pairs),
            "ratio_this_over_old": unregistered_ratio([r for pair in pairs for r in pair]),
            "ns_per_exec": {
                v: add_up([r[v] for pair in pairs for r in pair])["ns_per_run"]
                for v in ("old", "this")
            },
            "ratio_per_pair_of_rounds": {
                "min": min(ratios, default=None),
                "median": statistics.median(ratios) if ratios else None,
                "max": max(ratios, default=None),
            },
        }
    result["mount_watch_on_host"] = add_up([r["mount_watch"] for r in rounds])
    return result


def unregistered_ratio(rounds: list[dict[str, Any]]) -> float:
    """This object's ns per exec over the old one's, added up over `rounds`."""
    this, old = (add_up([r[v] for r in rounds])["ns_per_run"] for v in ("this", "old"))
    return round(this / old, 3) if old else float("nan")


def unregistered_round(
    variants: dict[str, ProbeOptions],
    reverse: bool,
    cgroup: Path,
    argvs: dict[str, list[str]],
) -> dict[str, Any]:
    """Both objects loaded (in one order or the other), then each path's execs: per path
    and object, ns (all its programs) and runs (its exit_execve's); and how often either
    emulation program ran meanwhile (another process registered a foreign entry: the
    round is not one without registration)."""
    out: dict[str, Any] = {"mount_watch": {"ns": 0, "runs": 0}}
    names = list(variants)[::-1] if reverse else list(variants)
    with ExitStack() as stack:
        probes = {v: stack.enter_context(Probe(variants[v])) for v in names}
        for probe in probes.values():
            stack.enter_context(drained(probe))
        fds = {v: p.program_fds() for v, p in probes.items()}
        for path, argv in argvs.items():
            before = {v: {n: fd_stats(fd) for n, fd in f.items()} for v, f in fds.items()}
            run_in(cgroup, argv)
            after = {v: {n: fd_stats(fd) for n, fd in f.items()} for v, f in fds.items()}
            out[path] = {
                v: {
                    "ns": sum(
                        after[v][n][0] - before[v][n][0] for n in fds[v] if n not in MOUNT_WATCH
                    ),
                    "runs": after[v]["exit_execve"][1] - before[v]["exit_execve"][1],
                }
                for v in fds
            } | {
                "emulated_exec_runs": sum(
                    after[v][EMULATION][1] - before[v][EMULATION][1] for v in fds
                )
            }
            for i, key in enumerate(("ns", "runs")):
                out["mount_watch"][key] += sum(
                    after["this"][n][i] - before["this"][n][i] for n in MOUNT_WATCH
                )
    return out


PHASES = ("kernel", "storm", "deaths", "search", "budget", "emulation", "unregistered")


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--success-execs", type=int, default=3000)
    parser.add_argument("--fail-execs", type=int, default=30000)
    parser.add_argument("--storm-rate", type=int, default=12000)
    parser.add_argument("--storm-seconds", type=float, default=10)
    parser.add_argument("--death-rate", type=int, default=1200)  # >= 1,000/s once started
    parser.add_argument("--death-seconds", type=float, default=10)
    parser.add_argument("--search-rate", type=int, default=1000)
    parser.add_argument("--search-seconds", type=float, default=10)
    parser.add_argument("--budget-execs", type=int, default=30000)
    parser.add_argument("--budget-rounds", type=int, default=5)
    parser.add_argument("--emulation-execs", type=int, default=30000)
    parser.add_argument("--unregistered-execs", type=int, default=20000)
    parser.add_argument("--unregistered-rounds", type=int, default=10)
    parser.add_argument("--old-rev", help="the git revision to compare, for --phases unregistered")
    parser.add_argument(
        "--old-object",
        type=Path,
        help="a BPF object from before the cgroup budget, for the budget phase",
    )
    parser.add_argument(
        "--phases",
        default=",".join(PHASES),
        help=f"comma-separated subset of {','.join(PHASES)} (default: all)",
    )
    args = parser.parse_args(argv)
    phases = set(args.phases.split(","))
    if not phases <= set(PHASES):
        parser.error(f"unknown phase in --phases {args.phases!r}")
    require_root()
    if not FOREIGN.exists() or not shutil.which("bpftrace"):
        raise SystemExit("needs dev/fetch-foreign.sh and bpftrace (make setup-test)")
    result: dict[str, object] = {"load_average_at_start": os.getloadavg()}
    with (
        tempfile.TemporaryDirectory() as tmp,
        sysctl("kernel.bpf_stats_enabled", "1"),
        own_cgroup(f"execwatch-bench-{os.getpid()}") as cgroup,
    ):
        gen = build_c("execgen.c", Path(tmp))
        if "kernel" in phases:
            result["kernel_cost"] = kernel_cost(gen, cgroup, args)
        if phases & {"storm", "deaths"}:
            # No budget: the storm measures the pipeline's cost per delivered record.
            with (
                Attributor() as attributor,
                Consumer.open(
                    attributor, ProbeOptions(budget_rate=0), watch_cgroup=os.stat(cgroup).st_ino
                ) as consumer,
            ):
                if "storm" in phases:
                    result["storm"] = storm(consumer.probe, consumer, gen, cgroup, args)
                if "deaths" in phases:
                    result["early_death_storm"] = death_storm(
                        consumer.probe, consumer, gen, cgroup, args
                    )
            result["diagnosis_of_storm_events"] = consumer.reasons
        if "search" in phases:
            result["path_search"] = path_search(gen, cgroup, args)
        if "budget" in phases:
            result["budget"] = budget_cost(gen, cgroup, args)
        if "emulation" in phases:
            result["emulation"] = emulation_cost(gen, cgroup, args)
        if "unregistered" in phases:
            result["unregistered"] = unregistered_cost(gen, cgroup, args)
    result["load_average_at_end"] = os.getloadavg()
    print(json.dumps(result, indent=2))
    name = "probe" if phases == set(PHASES) else "probe-" + "-".join(sorted(phases))
    print(f"saved {save(name, result)}")
    return result


if __name__ == "__main__":
    main()
