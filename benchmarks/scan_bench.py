"""Benchmark `execwatch scan` on a large root filesystem against the seed's `file` + `ldd`
loop, batched pax-utils `lddtree` and `scanelf -R`, in the same run, on a warm page cache.

    .venv/bin/python -m benchmarks.scan_bench [--rootfs DIR] [--repeat N]

Each tool's figure is its best wall time of N runs (1 by default, as `make bench` runs it),
with the CPU time (user + system, children included) of that run. `execwatch scan` runs
as users run it, a process writing its JSON report, like the other tools; the same scan is
also timed in-process (`scan()`: no interpreter start-up, imports or report), and
`execwatch scan --help` gives the start-up alone (interpreter and the scan command's imports).
execwatch's modules are byte-compiled first, as `pip install` does (and Debian does for
lddtree's Python): an editable checkout under PYTHONDONTWRITEBYTECODE would otherwise
compile every module at every start.

The rootfs (>= 20,000 files, >= 1 GB) is built once under .cache/bench/scan-rootfs by
copying this machine's /usr/bin, /usr/sbin, /usr/libexec, /usr/lib/x86_64-linux-gnu,
/usr/lib/python3*, /usr/lib/gcc, /usr/lib/llvm-*, /usr/include and parts of /usr/share with
Debian's merged-/usr layout. `lddtree` is run as users run it on a tree: one process for
all executables (`xargs`), resolving inside the tree (`-R`). `scanelf -R` is the floor: it
reads ELF headers with mmap and resolves nothing. "bytes read" is rchar from
/proc/self/io (read() syscalls, reaped children included; mmap is not counted), and for
execwatch also the bytes its reader asked for.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import execwatch
from benchmarks.common import RESULTS, save
from execwatch.binfmt import Platform
from execwatch.scan.runner import ScanOptions, scan

SOURCES = [
    "usr/bin",
    "usr/sbin",
    "usr/libexec",
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/python3.11",
    "usr/lib/python3",
    "usr/include",
    "usr/lib/gcc",
    "usr/lib/llvm-14",
    "usr/lib/llvm-16",
    "usr/lib/jvm",
    "usr/share/perl",
    "usr/share/perl5",
    "usr/share/locale",
]
EXECWATCH = str(Path(sys.executable).with_name("execwatch"))  # the venv's console script
MIN_FILES = 20_000
TARGET_VS_LOOP = 5.0
TARGET_VS_SCANELF = 2.5


def rchar() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise RuntimeError("no rchar in /proc/self/io")


def build_rootfs(root: Path) -> Path:
    stamp = root / ".complete-v3"
    if stamp.exists():
        return root
    if root.exists():
        shutil.rmtree(root)
    for rel in SOURCES:
        src = Path("/") / rel
        if src.exists():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(["cp", "-a", "--reflink=auto", str(src), str(root / rel)], check=True)
    (root / "usr/lib64").mkdir(parents=True, exist_ok=True)
    (root / "usr/lib64/ld-linux-x86-64.so.2").symlink_to(
        "../lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"
    )
    for name in ("bin", "sbin", "lib", "lib64"):
        (root / name).symlink_to(f"usr/{name}")
    (root / "etc").mkdir()
    if Path("/etc/ld.so.conf").exists():
        shutil.copy("/etc/ld.so.conf", root / "etc/ld.so.conf")
        shutil.copytree("/etc/ld.so.conf.d", root / "etc/ld.so.conf.d", symlinks=True)
    stamp.touch()
    return root


def inventory(root: Path) -> tuple[int, int, list[Path]]:
    """(files, bytes, executables) under root, not following symlinks."""
    files = size = 0
    executables = []
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            path = Path(dirpath, name)
            st = path.lstat()
            if path.is_symlink() or not path.is_file():
                continue
            files += 1
            size += st.st_size
            if st.st_mode & 0o111:
                executables.append(path)
    return files, size, executables


def warm(root: Path) -> None:
    subprocess.run(
        f"find {root} -type f -print0 | xargs -0 cat > /dev/null", shell=True, check=True
    )


T = TypeVar("T")


@dataclass(frozen=True)
class Timing(Generic[T]):
    seconds: float  # wall
    cpu: float  # user + system, this process and the children it reaped
    rchar: int
    result: T


def timed(fn: Callable[[], T], repeat: int = 1) -> Timing[T]:
    """The run with the best wall time of `repeat` (the same for every tool)."""
    best: Timing[T] | None = None
    for _ in range(repeat):
        before, start, cpu = rchar(), time.perf_counter(), _cpu()
        result = fn()
        run = Timing(time.perf_counter() - start, _cpu() - cpu, rchar() - before, result)
        best = run if best is None or run.seconds < best.seconds else best
    assert best is not None
    return best


def _cpu() -> float:
    own, children = os.times(), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.user + own.system + children.ru_utime + children.ru_stime


def run_execwatch(root: Path) -> tuple[int, int, int]:
    """`execwatch scan ROOT --format json -o FILE`: (files, executables, findings)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp, "report.json")
        argv = [EXECWATCH, "scan", str(root), "--platform", "linux/amd64", "--format", "json"]
        done = subprocess.run([*argv, "-o", str(report)], capture_output=True, text=True)
        if done.returncode not in (0, 1):  # 1: findings at or above --fail-on
            sys.exit(f"execwatch scan failed ({done.returncode}): {done.stderr.strip()}")
        doc = json.loads(report.read_text())
    (stats,) = [image["stats"] for image in doc["images"]]
    return stats["files"], stats["executables"], len(doc["findings"])


def run_execwatch_in_process(root: Path) -> tuple[int, int, int]:
    report = scan(str(root), ScanOptions(platforms=(Platform.parse("linux/amd64"),)))
    (result,) = report.results
    return result.stats.files, result.stats.executables, result.stats.bytes_read


def run_execwatch_start() -> None:
    subprocess.run([EXECWATCH, "scan", "--help"], capture_output=True, check=True)


def run_file_ldd(executables: list[Path]) -> int:
    """The seed's CI gate, per executable: `file`, then `ldd` on dynamic ELF files."""
    dynamic = 0
    for path in executables:
        kind = subprocess.run(["file", "-b", str(path)], capture_output=True, text=True).stdout
        if "ELF" in kind and "dynamically linked" in kind:
            dynamic += 1
            subprocess.run(["ldd", str(path)], capture_output=True)
    return dynamic


def run_scanelf(root: Path) -> int:
    out = subprocess.run(
        ["scanelf", "-R", "-B", "-F", "%a %i %n %F", str(root)], capture_output=True, text=True
    )
    return len(out.stdout.splitlines())


def run_lddtree(root: Path, executables: list[Path]) -> int:
    """`… | xargs -0 lddtree -R ROOT --skip-non-elfs`, paths inside ROOT: few processes.

    Debian's lddtree is Python with python3-pyelftools; it is run with the system Python
    so a virtualenv or pyenv `python3` on PATH cannot hide that module.
    """
    names = b"\0".join(b"/" + str(p.relative_to(root)).encode() for p in executables)
    argv = [
        "xargs",
        "-0",
        "/usr/bin/python3",
        shutil.which("lddtree") or "lddtree",
        "-R",
        str(root),
    ]
    out = subprocess.run(argv, input=names, capture_output=True)
    if b"ModuleNotFoundError" in out.stderr:
        sys.exit("lddtree cannot run: install python3-pyelftools (dev/setup.sh --test does)")
    return sum(1 for line in out.stdout.splitlines() if not line.startswith(b" "))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rootfs", type=Path, default=RESULTS / "scan-rootfs")
    parser.add_argument("--repeat", type=int, default=1, help="best of N runs for every tool")
    args = parser.parse_args(argv)
    for tool in ("file", "ldd", "scanelf", "lddtree"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} not found: run dev/setup.sh --test")
    root = build_rootfs(args.rootfs)
    files, size, executables = inventory(root)
    print(f"rootfs {root}: {files} files, {size / 1e9:.2f} GB, {len(executables)} executables")
    if files < MIN_FILES or size < 1e9:
        sys.exit(f"rootfs too small for the benchmark (want >= {MIN_FILES} files and >= 1 GB)")
    warm(root)
    if not compileall.compile_dir(Path(execwatch.__file__).parent, quiet=1):
        sys.exit("cannot byte-compile execwatch")

    n = args.repeat
    ew = timed(lambda: run_execwatch(root), n)
    inproc = timed(lambda: run_execwatch_in_process(root), n)
    start = timed(run_execwatch_start, 3)
    loop = timed(lambda: run_file_ldd(executables), n)
    scanelf = timed(lambda: run_scanelf(root), n)
    lddtree = timed(lambda: run_lddtree(root, executables), n)
    rows: list[tuple[str, Timing[Any], int, int, str]] = [
        ("execwatch scan", ew, ew.result[0], ew.result[1],
         f"executables checked; a process writing its JSON report ({ew.result[2]} findings)"),
        ("file + ldd loop", loop, files, len(executables),
         f"executables; {loop.result} ldd calls"),
        ("scanelf -R (mmap)", scanelf, files, scanelf.result, "ELF files listed; headers only"),
        ("lddtree -R, batched", lddtree, files, lddtree.result, "ELF files resolved (xargs)"),
        ("execwatch scan, in-process", inproc, inproc.result[0], inproc.result[1],
         f"scan() alone, no start-up or report; reader asked for {inproc.result[2] / 1e6:.1f} MB"),
    ]  # fmt: skip
    print(f"best of {n} run(s) each, one after the other\n")
    print(f"{'tool':28} {'seconds':>8} {'CPU s':>7} {'files/s':>9} {'items/s':>8} {'MB read':>8}"
          "  items")  # fmt: skip
    result: dict[str, object] = {"files": files, "bytes": size, "executables": len(executables)}
    for name, t, n_f, n_e, note in rows:
        print(f"{name:28} {t.seconds:8.2f} {t.cpu:7.2f} {n_f / t.seconds:9.0f}"
              f" {n_e / t.seconds:8.0f} {t.rchar / 1e6:8.1f}  {note}")  # fmt: skip
        result[name] = {"seconds": t.seconds, "cpu_seconds": t.cpu, "rchar": t.rchar,
                        "files": n_f, "executables": n_e}  # fmt: skip
    print(f"\nexecwatch start-up (`execwatch scan --help`, best of 3): {start.seconds:.2f} s,"
          f" {start.cpu:.2f} CPU s")  # fmt: skip
    for label, t in (("execwatch scan", ew), ("in-process scan()", inproc)):
        print(f"{label}: {loop.seconds / t.seconds:.1f}x faster than the file + ldd loop"
              f" (target >= {TARGET_VS_LOOP}x), {t.seconds / scanelf.seconds:.1f}x scanelf's"
              f" time (target <= {TARGET_VS_SCANELF}x); in CPU time {loop.cpu / t.cpu:.1f}x and"
              f" {t.cpu / scanelf.cpu:.1f}x")  # fmt: skip
    load = os.getloadavg()
    print(f"load average {load[0]:.1f} (1 min), {load[2]:.1f} (15 min) on {os.cpu_count()} CPUs:"
          " wall times on a shared machine are noisy, CPU times less so")  # fmt: skip
    result["speedup_vs_file_ldd"] = loop.seconds / ew.seconds
    result["time_vs_scanelf"] = ew.seconds / scanelf.seconds
    result["in_process"] = {
        "speedup_vs_file_ldd": loop.seconds / inproc.seconds,
        "time_vs_scanelf": inproc.seconds / scanelf.seconds,
    }
    result["startup_seconds"] = start.seconds
    result["repeat"] = n
    result["load_average"] = load
    print(f"saved {save('scan_bench', result)}")


if __name__ == "__main__":
    main()
