"""The probe's cost per successful exec on each kernel of the matrix (tests/kernels),
against a return-only program on the same tracepoint, from bpf_stats.

    .venv/bin/python -m benchmarks.kernel_bench [--execs 2000]

Each kernel boots under QEMU as in the matrix and runs this module with --guest: the
real probe and benchmarks/return_only.bpf.c attached together, then `execgen success N`
(fork+exec of /bin/true; half with each program attached first), then each program's
run_time_ns / run_cnt. A guest runs nothing else, so no other process's failed exec
lands in the batch (on the host, probe_bench keeps only the rounds without one). Under
TCG every instruction is emulated: compare the two programs on one kernel, not kernels
with each other or with the host.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from contextlib import ExitStack
from pathlib import Path

from tests.support.kernels.vm import RELEASES, Kernel, Vm

from benchmarks.common import RESULTS, build_c, require_root, save, sysctl
from benchmarks.probe_bench import (
    ORDERS,
    add_up,
    attach_in_order,
    fdinfo_prog_id,
    per_exec,
    prog_stats,
)

GUEST_BUDGET_S = 600


def measure(gen: Path, execs: int) -> dict[str, object]:
    """Both programs on sys_exit_execve, one batch of successful execs in each attach order
    (the first program on a tracepoint pays more: see probe_bench), added up."""
    parts = [measure_in_order(gen, execs // 2, first) for first in ORDERS]
    ours_cost, base_cost = (add_up([p[i] for p in parts]) for i in (0, 1))
    ours_ns, base_ns = ours_cost["ns_per_run"], base_cost["ns_per_run"]
    return {
        "kernel": os.uname().release,
        "execwatch": ours_cost,
        "return_only": base_cost,
        "extra_ns_per_exec": round(ours_ns - base_ns, 1),
        "ratio": round(ours_ns / base_ns, 2) if base_ns else None,
    }


def measure_in_order(gen: Path, execs: int, order: str) -> tuple[dict[str, float], ...]:
    with ExitStack() as stack:
        stack.enter_context(sysctl("kernel.bpf_stats_enabled", "1"))
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        probe, baseline = attach_in_order(stack, tmp, order)
        ours = fdinfo_prog_id(probe.program_fds()["exit_execve"])
        before = prog_stats(ours), prog_stats(baseline)
        subprocess.run([gen, "success", str(execs)], check=True, capture_output=True)
        after = prog_stats(ours), prog_stats(baseline)
    return per_exec(before[0], after[0]), per_exec(before[1], after[1])


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--execs", type=int, default=2000)
    parser.add_argument("--guest", type=Path, help=argparse.SUPPRESS)  # inside a QEMU guest
    parser.add_argument("--gen", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    require_root()
    if args.guest:
        result = measure(args.gen, args.execs)
        (args.guest / "bench.json").write_text(json.dumps(result))
        return result
    RESULTS.mkdir(parents=True, exist_ok=True)
    gen = build_c("execgen.c", RESULTS)  # under the repository: the guests see it over 9p
    results: dict[str, object] = {}
    command = f".venv/bin/python -m benchmarks.kernel_bench --guest /tmp/out --gen {gen}"
    with tempfile.TemporaryDirectory(prefix="execwatch-kernel-bench-") as tmp:
        vms = [
            Vm(Kernel.fetched(r), f"{command} --execs {args.execs}", Path(tmp) / r)
            for r in RELEASES
        ]
        try:
            for vm in vms:
                boot = vm.wait(GUEST_BUDGET_S)
                path = boot.out / "bench.json"
                if not path.exists():
                    raise SystemExit(f"no result from {boot.explain()}")
                results[vm.kernel.release] = json.loads(path.read_text())
        finally:
            for vm in vms:
                vm.kill()
    print(json.dumps(results, indent=2))
    print(f"saved {save('kernels', results)}")
    return results


if __name__ == "__main__":
    main()
