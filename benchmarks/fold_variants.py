"""Where a folded PATH-search miss spends its kernel time: variants of the probe, side by side.

    sudo .venv/bin/python -m benchmarks.fold_variants [--loads 4] [--rounds 8] [--misses 4]
        [VARIANT ...]

Each variant is the shipped `execwatch.bpf.c` with a few lines replaced, built by the
Makefile's rule. Some are ablations, not sound probes (`no_identity` folds every cgroup
together): they price one part of the fold path by leaving it out. Each load is a fresh
probe: five half-second storms of fresh children exec'ing a program by its path (their
median is the successful exec's cost in a storm), then one-second rounds of probe_bench's
PATH-search storm (--misses directories that lack the program before the one that has it);
a round of either counts only when no other process failed an exec meanwhile. A load's
figure is its rounds' median kernel ns per miss; the variants alternate order load by
load. One round sometimes costs microseconds per run with nothing else running on this
machine (docs/trace.md, "PATH-search noise"): hence medians, and several loads.
Not part of `make bench`: it is for trying changes to the fold path.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

from benchmarks import probe_bench as pb
from benchmarks.common import build_c, require_root, save, sysctl
from execwatch.probe.loader import Probe, ProbeOptions

REPO = Path(pb.__file__).resolve().parent.parent
BPF_DIR = REPO / "src" / "execwatch" / "bpf"

FIXED_NAMES = (
    "\tlong n = 41;\n\t__u64 r = bpf_get_prandom_u32() & 3;\n#pragma unroll\n"
    "\tfor (int j = 0; j < 6; j++)\n\t\tf->words[j] = 0x2f2f2f2f2f2f2f2fULL + j + (r << 8);"
)
NH_LOOP = "\tfor (__u32 i = 0; i < EW_FOLD_WORDS; i++) {\n\t\tif (i == last)"


def until(stage: str, shipped: str, keep: str) -> tuple[str, list[tuple[str, str]]]:
    """An ablation that returns just before `shipped` (a line of on_failure), keeping the
    registers in `keep` alive so that nothing before it is optimised away."""
    stop = f'\tif (cfg.fold_window_ns) {{\n\t\tasm volatile("" :: {keep});\n\t\treturn 0;\n\t}}\n'
    return f"ablation: the fold path up to {stage}, then return", [(shipped, stop + shipped)]


# name -> (what it shows, [(shipped text, replacement)])
VARIANTS: dict[str, tuple[str, list[tuple[str, str]]]] = {
    "shipped": ("the object as it ships", []),
    "until_total": until("the per-errno total", "\ttask = current_task();", '"r"(idx)'),
    "until_identity": until(
        "the identity and the name's address",
        "\tif (sc == EW_EXECVE && ret == -ENOENT && cfg.fold_window_ns)",
        '"r"(cgroup_id), "r"(mntns), "r"(root_ino), "r"(name)',
    ),
    "until_tag": until("the name's read and its tag", "\tif (tag) {", '"r"(tag)'),
    "until_set": until("the set's address", "\tif (set) {", '"r"(set), "r"(epoch)'),
    "no_wakeup": (
        "ablation: no record wakes the consumer (each wakeup is an irq_work, a self-IPI here)",
        [
            (
                "\tbpf_ringbuf_submit(e, wakeup_flag(now, cgroup_id));\n\treturn 0;\n}\n\nSEC(",
                "\tbpf_ringbuf_submit(e, BPF_RB_NO_WAKEUP);\n\treturn 0;\n}\n\nSEC(",
            )
        ],
    ),
    "no_epoch": (
        "ablation: a name once sent is folded on its CPU for good, with no record each "
        "fold window (the fold hit alone; the window's records and their wakeups gone)",
        [
            (
                "\t\tif (way >= 0 && set->way[way & (EW_FOLD_WAYS - 1)].epoch == epoch) {",
                "\t\tif (way >= 0) {",
            )
        ],
    ),
    "no_identity": (
        "ablation: cgroup, mount namespace and root are constants (no pointer chains)",
        [
            ("\tcgroup_id = current_cgroup_id(task);", "\tcgroup_id = 7;"),
            ("\tcaller_root(task, &mntns, &root_ino);", "\tmntns = 5;\n\troot_ino = 3;"),
        ],
    ),
    "no_name_read": (
        "ablation: no bpf_probe_read_user_str; one of four fixed names at random",
        [("\tlong n = bpf_probe_read_user_str(f->words, EW_FOLD_NAME_LEN, name);", FIXED_NAMES)],
    ),
    "inline_failure": (
        "on_failure inlined into each program: no call, but every successful exec pays "
        "the bigger program's prologue",
        [
            (
                "static __noinline int on_failure(long ret, enum ew_syscall sc)",
                "static __always_inline int on_failure(long ret, enum ew_syscall sc)",
            )
        ],
    ),
    "inline_early_exit": (
        "inline_failure, and the success return its own BPF exit: the x86 JIT puts the "
        "epilogue at a program's first exit, so the success path no longer jumps to the end",
        [
            (
                "static __noinline int on_failure(long ret, enum ew_syscall sc)",
                "static __always_inline int on_failure(long ret, enum ew_syscall sc)",
            ),
            (
                "\treturn ctx->ret < 0 ? on_failure(ctx->ret, EW_EXECVE) : 0;",
                '\tif (ctx->ret >= 0) {\n\t\tasm volatile("r0 = 0\\n\\texit" ::: "r0");\n'
                "\t\t__builtin_unreachable();\n\t}\n\treturn on_failure(ctx->ret, EW_EXECVE);",
            ),
        ],
    ),
    "rolled_nh": (
        "the NH loop over the name's words not unrolled (a smaller fold path)",
        [("#pragma unroll\n" + NH_LOOP, "#pragma clang loop unroll(disable)\n" + NH_LOOP)],
    ),
    "task_stack": (
        "the name on the task's kernel stack, not the per-CPU private stack (6.13+) that a "
        "subprogram of 64 bytes of stack gets: a tail call anywhere turns that off, so a dead one",
        [
            (
                "const volatile struct ew_config cfg = {};",
                "const volatile struct ew_config cfg = {};\n\nstruct {\n"
                "\t__uint(type, BPF_MAP_TYPE_PROG_ARRAY);\n\t__uint(max_entries, 1);\n"
                '\t__type(key, __u32);\n\t__type(value, __u32);\n} no_priv_stack SEC(".maps");',
            ),
            (
                "\treturn ctx->ret < 0 ? on_failure(ctx->ret, EW_EXECVE) : 0;",
                "\tif (ctx->ret >= 0)\n\t\treturn 0;\n\ton_failure(ctx->ret, EW_EXECVE);\n"
                "\tif (cfg.fold_key[0] == 0 && cfg.fold_key[1] == 0)\n"
                "\t\tbpf_tail_call(ctx, &no_priv_stack, 0);\n\treturn 0;",
            ),
        ],
    ),
    "key_immediates": (
        "ablation: the NH key as constants in the instructions, no loads from .rodata "
        "(a loader could patch random ones in)",
        [
            (
                "h += nh(f->words[i], cfg.fold_key[i]);",
                "h += nh(f->words[i], 0x9e3779b97f4a7c15ULL * (i + 1));",
            ),
            (
                "h += nh(cgroup_id, cfg.fold_key[EW_FOLD_WORDS]);",
                "h += nh(cgroup_id, 0x12345678deadbeefULL);",
            ),
            (
                "h += nh(root_ino, cfg.fold_key[EW_FOLD_WORDS + 1]);",
                "h += nh(root_ino, 0x2345678deadbeef1ULL);",
            ),
            (
                "h += nh(mntns | (__u64)f->len << 32, cfg.fold_key[EW_FOLD_WORDS + 2]);",
                "h += nh(mntns | (__u64)f->len << 32, 0x345678deadbeef12ULL);",
            ),
        ],
    ),
}


def build(name: str, out_dir: Path) -> Path:
    """The variant's source beside the shipped headers, compiled by the Makefile's rule."""
    text = (BPF_DIR / "execwatch.bpf.c").read_text()
    for old, new in VARIANTS[name][1]:
        if text.count(old) != 1:
            raise SystemExit(f"variant {name}: its text is no longer in execwatch.bpf.c once")
        text = text.replace(old, new)
    src = out_dir / name
    src.mkdir()
    (src / "execwatch.bpf.c").write_text(text)
    for header in ("execwatch.h", "compat.bpf.h"):
        shutil.copy(BPF_DIR / header, src)
    obj = src / "execwatch.bpf.o"
    make = ["make", "-s", "-C", str(REPO), "bpf", f"BPF_DIR={src}", f"BPF_OBJ={obj}"]
    subprocess.run(make, check=True)
    return obj


def one_load(
    obj: Path, gen: Path, cgroup: Path, dirs: list[Path], rounds: int, misses: int
) -> dict[str, float]:
    env = {"PATH": ":".join(map(str, dirs[:misses] + dirs[-1:]))}
    run = [str(gen), "run", "1000", "0.5", str(dirs[-1] / pb.SEARCH_NAME)]
    search = [str(gen), "search", "1000", "1", pb.SEARCH_NAME]
    with Probe(ProbeOptions(object_path=obj)) as probe:
        consumer = pb.Consumer(probe, None, watch_cgroup=os.stat(cgroup).st_ino)
        try:
            successes = [r for r, ok in pb.exec_rounds(probe, cgroup, run, 5, 0, env) if ok]
            rounds_run = pb.exec_rounds(probe, cgroup, search, rounds, misses, env)
            searches = [r for r, ok in rounds_run if ok]
        finally:
            consumer.stop()
    if not successes or not searches:
        raise SystemExit("no round ran without another process's failed exec")
    success_ns = statistics.median(r["ns_per_run"] for r in successes)
    per_miss = [pb.per_miss_ns(r, success_ns) for r in searches]
    return {
        "miss_ns": statistics.median(ns for ns in per_miss if ns is not None),
        "success_ns_in_storm": success_ns,
    }


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loads", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--misses", type=int, default=pb.SEARCH_MISSES,
                        choices=range(1, pb.SEARCH_MISSES + 1),
                        help="misses per search, each in a fresh child (%(default)s)")  # fmt: skip
    parser.add_argument("variants", nargs="*", default=list(VARIANTS), metavar="VARIANT",
                        help=f"any of {', '.join(VARIANTS)} (default: all)")  # fmt: skip
    args = parser.parse_args(argv)
    unknown = sorted(set(args.variants) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variant {', '.join(unknown)}")
    require_root()
    loads: dict[str, list[dict[str, float]]] = {name: [] for name in args.variants}
    with (
        tempfile.TemporaryDirectory() as tmp,
        sysctl("kernel.bpf_stats_enabled", "1"),
        pb.own_cgroup(f"execwatch-fold-variants-{os.getpid()}") as cgroup,
    ):
        gen = build_c("execgen.c", Path(tmp))
        dirs = pb.search_dirs(Path(tmp))
        objs = {name: build(name, Path(tmp)) for name in args.variants}
        for i in range(args.loads):
            for name in args.variants if i % 2 == 0 else args.variants[::-1]:
                obj = objs[name]
                loads[name].append(one_load(obj, gen, cgroup, dirs, args.rounds, args.misses))
                print(name, loads[name][-1], flush=True)
    result: dict[str, object] = {
        "misses_per_search": args.misses,
        "load_average_at_end": os.getloadavg(),
    }
    for name, figures in loads.items():
        misses = sorted(round(f["miss_ns"], 1) for f in figures)
        result[name] = {
            "what": VARIANTS[name][0],
            "miss_ns_median_of_loads": round(statistics.median(misses), 1),
            "miss_ns_per_load": misses,
            "success_ns_in_storm_median": round(
                statistics.median(f["success_ns_in_storm"] for f in figures), 1
            ),
        }
    print(json.dumps(result, indent=2))
    print(f"saved {save('fold-variants', result)}")
    return result


if __name__ == "__main__":
    main()
