"""Benchmark `execwatch scan ARCHIVE --run --run-args --version` against the seed's smoke
test, `docker run --rm IMAGE --version`, on the same image archives, in one run.

    .venv/bin/python -m benchmarks.smoke_bench [--repeat N] [--cold N]

Two images, one archive each (a `docker save` archive, written by skopeo from an OCI layout):
- linux/amd64, native: Debian's own `/usr/bin/true` (coreutils) on the host's libc6 and
  busybox-static packages, started as `true --version`;
- linux/arm64, emulated: Debian's arm64 `hello`, libc6 and busybox-static
  (dev/fetch-foreign.sh), started as `hello --version` under Debian's qemu-aarch64-static
  (dev/fetch-emulators.sh).

Docker is Debian's `docker.io`: a private dockerd (tests/support/engines/dockerd.py, its own
socket, data root and containerd), started here and stopped after; each archive is loaded
with `docker load -i ARCHIVE`, and `execwatch scan` reads the very same file. Docker runs
arm64 through a host binfmt_misc entry for qemu-aarch64-static with the flags
`tonistiigi/binfmt` uses (`CF`: the interpreter opened once at registration, credentials
from the program): the benchmark mounts binfmt_misc if it is not mounted, registers the
entry under a name of its own only around the arm64 runs, and in `finally` removes it
(`echo -1`) and unmounts what it mounted: the host's table is left as it was found. While
the entry is there, arm64 programs anywhere on the host run under QEMU.
execwatch's emulated run gets the same QEMU binary with `--qemu-dir` (it registers it in
its sandbox's own user-namespace table, which the host's entry does not reach).
execwatch is timed twice: as is (its work directory under $TMPDIR, this machine's disk;
these small images unpack on a tmpfs of the run's own) and with TMPDIR=/dev/shm (where an
image too large for that tmpfs would unpack; Docker unpacks an image once, at
`docker load`).

Per platform, the tools' runs are interleaved (one of each, then again), so that a load
that comes and goes on a shared machine hits them alike:
- warm: one discarded run, then the median and minimum wall time of N runs;
- cold: `echo 3 > /proc/sys/vm/drop_caches` before each run (median, minimum); for Docker
  also the first run of a just-loaded image (`docker rmi`, caches dropped, `docker load`,
  then the timed run; the load's own time is reported beside it);
- peak memory, in one more warm run, sampled every 5 ms (so that sampling never slows a
  timed run): execwatch, the summed RSS of its process tree (the scan, its unpack and run
  children, the sandbox, the program and QEMU) and the largest single process
  (RUSAGE_CHILDREN ru_maxrss, exact); Docker, the summed RSS of the client and everything
  that serves the run: dockerd, containerd, the shim, runc and the container's processes,
  with the client's own ru_maxrss (exact).
- where execwatch's time goes, the least of 3 runs each: `execwatch scan --help` (the
  interpreter's start and imports), and the scan in-process with its forked children
  called in place (no fork, no pickling) and each phase timed: the static scan, the
  unpack, the sandbox with the program, the tree's removal, and the total.
Every run's output is checked: the program's `--version` line from Docker, a `run-started`
finding with exit code 0 from execwatch. Needs root (dockerd, drop_caches, binfmt_misc).
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import hashlib
import importlib
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from tests.support.engines.dockerd import Dockerd
from tests.support.images.imagebuild import (
    Entry,
    Image,
    file,
    layer_tar,
    oci_layout,
    symlink,
    tree,
)

import execwatch
from benchmarks.common import RESULTS, peak_while, save
from execwatch.smoke.runs import QEMU

HERE = Path(__file__).resolve().parent
CACHE = RESULTS.parent
EMULATORS = CACHE / "emulators"
ARM64_ROOT = CACHE / "foreign" / "arm64" / "root"
EXECWATCH = str(Path(sys.executable).with_name("execwatch"))  # the venv's console script
BINFMT = Path("/proc/sys/fs/binfmt_misc")
TARGET_NATIVE = 1.0  # execwatch's wall time over Docker's, at most
TARGET_EMULATED = 1.2
SAMPLE_S = 0.005
T = TypeVar("T")
TMPFS = "/dev/shm"


@dataclass(frozen=True)
class Subject:
    """One platform's image: its archive, its tag in dockerd and what `--version` prints."""

    platform: str
    emulated: bool
    archive: Path
    tag: str
    expect: str


@dataclass(frozen=True)
class Times:
    runs: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.runs)

    @property
    def min(self) -> float:
        return min(self.runs)

    def doc(self) -> dict[str, Any]:
        return {"median_s": self.median, "min_s": self.min, "runs_s": self.runs}


# -- the images ------------------------------------------------------------------------------


def debian_package(package: str) -> list[Entry]:
    """The host's installed files of `package` (not /usr/share), merged-/usr paths."""
    listed = subprocess.run(["dpkg", "-L", package], capture_output=True, text=True, check=True)
    entries = []
    for name in listed.stdout.splitlines():
        path = Path(name)
        if name.startswith("/usr/share") or path.is_dir() or not path.exists():
            continue
        rel = name.lstrip("/")
        rel = rel if rel.startswith("usr/") else f"usr/{rel}"  # /lib64/... is /usr/lib64/...
        if path.is_symlink():
            entries.append(symlink(rel, os.readlink(path)))
        else:
            entries.append(file(rel, path.read_bytes(), path.stat().st_mode & 0o755))
    return entries


@dataclass
class LoadableImage(Image):
    """An image whose config lists its layers' diff_ids, as `docker load` insists."""

    def config(self) -> dict[str, Any]:
        config = super().config()
        config["rootfs"]["diff_ids"] = [f"sha256:{hashlib.sha256(layer_tar(e)).hexdigest()}"
                                        for e in self.layers]  # fmt: skip
        return config


MERGED_USR = tuple(symlink(name, f"usr/{name}") for name in ("bin", "sbin", "lib", "lib64"))


def amd64_image() -> Image:
    layer = [*debian_package("libc6"), *debian_package("busybox-static"), *MERGED_USR,
             file("usr/bin/true", Path("/usr/bin/true").read_bytes())]  # fmt: skip
    return LoadableImage([layer], entrypoint=["/usr/bin/true"])


def arm64_image() -> Image:
    if not (ARM64_ROOT / "usr/bin/hello").exists():
        sys.exit(f"{ARM64_ROOT} has no usr/bin/hello: run dev/setup.sh --test")
    layer = [*tree(ARM64_ROOT), *MERGED_USR]
    return LoadableImage([layer], architecture="arm64", entrypoint=["/usr/bin/hello"])


def docker_archive(work: Path, image: Image, tag: str) -> Path:
    """A `docker save` archive of `image` as `tag` (what `docker load` reads), via skopeo."""
    name = tag.split("/")[-1].split(":")[0]
    layout = oci_layout(work / f"{name}-layout", [image])
    archive = work / f"{name}.tar"
    subprocess.run(["skopeo", "copy", "-q", f"oci:{layout}", f"docker-archive:{archive}:{tag}"],
                   check=True, capture_output=True, timeout=300)  # fmt: skip
    shutil.rmtree(layout)
    return archive


def subjects(work: Path) -> list[Subject]:
    made = []
    for platform, emulated, image, expect in (
        ("linux/amd64", False, amd64_image(), "(GNU coreutils)"),
        ("linux/arm64", True, arm64_image(), "(GNU Hello)"),
    ):
        tag = f"execwatch-bench/{platform.split('/')[1]}:1"
        made.append(Subject(platform, emulated, docker_archive(work, image, tag), tag, expect))
    return made


# -- the runs ------------------------------------------------------------------------------


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def docker_argv(dockerd: Dockerd, subject: Subject) -> list[str]:
    platform = ["--platform", subject.platform] if subject.emulated else []
    return ["docker", "-H", dockerd.host, "run", "--rm", *platform, subject.tag, "--version"]


def run_docker(dockerd: Dockerd, subject: Subject) -> None:
    done = subprocess.run(docker_argv(dockerd, subject), capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    if done.returncode != 0 or subject.expect not in done.stdout:
        sys.exit(f"docker run {subject.tag} --version: exit {done.returncode}, "
                 f"{(done.stdout + done.stderr).strip()[-300:]!r}")  # fmt: skip


def execwatch_argv(subject: Subject, report: Path | None) -> list[str]:
    """The scan as a user runs it; its JSON report to `report` (None: stdout)."""
    argv = [EXECWATCH, "scan", str(subject.archive), "--run", "--run-args=--version",
            "--no-progress", "--format", "json"]  # fmt: skip
    argv += ["-o", str(report)] if report else []
    return [*argv, "--qemu-dir", str(EMULATORS)] if subject.emulated else argv


def run_execwatch(subject: Subject, report: Path, tmpdir: str | None = None) -> None:
    env = {**os.environ, "TMPDIR": tmpdir} if tmpdir else None
    done = subprocess.run(execwatch_argv(subject, report), capture_output=True, text=True,
                          timeout=300, env=env)  # fmt: skip
    if done.returncode != 0:
        sys.exit(f"execwatch scan --run {subject.archive.name}: exit {done.returncode}, "
                 f"{done.stderr.strip()[-300:]!r}")  # fmt: skip
    started = [f for f in json.loads(report.read_text())["findings"]
               if f.get("source") == "run" and f["check"] == "run-started"]  # fmt: skip
    if len(started) != 1 or "exit 0" not in started[0]["message"]:
        sys.exit(f"execwatch scan --run {subject.archive.name}: no clean run-started: {started}")


def timed(fn: Callable[[], None], count: int, before: Callable[[], None] | None = None) -> Times:
    runs = []
    for _ in range(count):
        if before is not None:
            before()
        start = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - start)
    return Times(runs)


# -- peak memory -----------------------------------------------------------------------------


def process_table() -> dict[int, tuple[int, int, str]]:
    """pid -> (ppid, RSS kB, cmdline) of every process now."""
    page_kb = os.sysconf("SC_PAGE_SIZE") // 1024
    table = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
            cmdline = Path(entry.path, "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue  # exited meanwhile
        fields = stat.rsplit(")", 1)[1].split()
        table[int(entry.name)] = (int(fields[1]), int(fields[21]) * page_kb, cmdline)
    return table


def tree_rss_kb(table: dict[int, tuple[int, int, str]], roots: set[int], marker: str) -> int:
    """Summed RSS of all descendants of `roots`, and of processes whose cmdline names
    `marker` with theirs (a shim is reparented away from containerd, but names its socket)."""
    members = {pid for pid, (_, _, cmd) in table.items() if marker and marker in cmd}
    members |= {pid for pid, (ppid, _, _) in table.items() if ppid in roots}
    grew = True
    while grew:
        more = {pid for pid, (ppid, _, _) in table.items() if ppid in members} - members
        members |= more
        grew = bool(more)
    return sum(table[pid][1] for pid in members - roots)


def peak_memory(argv: list[str], marker: str = "") -> tuple[float, float]:
    """(peak summed RSS, the largest process's ru_maxrss) in MB for one run of `argv`, as
    the child of a small Python process so that its RUSAGE_CHILDREN covers only that run;
    the tree is that process's descendants (not itself) and what names `marker`."""
    probe = (
        "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True,"
        " capture_output=True); print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    child: list[int] = []
    with peak_while(lambda: tree_rss_kb(process_table(), set(child), marker), SAMPLE_S) as peak:
        proc = subprocess.Popen([sys.executable, "-c", probe, *argv], stdout=subprocess.PIPE,
                                text=True)  # fmt: skip
        child.append(proc.pid)
        out, _ = proc.communicate(timeout=300)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(argv[:3])}: exit {proc.returncode} in the memory run")
    return peak[0] / 1024, int(out.strip()) / 1024


# -- where execwatch's time goes -------------------------------------------------------------

# phase -> (module, function) timed in `phases_child`
PHASES = {
    "static scan": ("execwatch.scan.cli", "scan"),
    "unpack": ("execwatch.smoke.runs", "unpack_root"),
    "sandbox and program": ("execwatch.smoke.namespaces", "run"),
    "tree removal": ("execwatch.smoke.runs", "remove_tree"),
}


def phases(subject: Subject, tmpdir: str | None = None, count: int = 3) -> dict[str, float]:
    """Each phase's least seconds in `count` runs of `execwatch scan --run` (`phases_child`,
    each in a process of its own), and of `execwatch scan --help`, the interpreter's start
    and imports: the minimum, the figure a passing load disturbs least."""
    code = "import sys; from benchmarks.smoke_bench import phases_child; phases_child(sys.argv[1:])"
    argv = execwatch_argv(subject, None)[1:]
    runs: list[dict[str, float]] = []
    for _ in range(count):
        # a directory of its own, removed here: in place, the run's tree is made and
        # (after the drop to nobody, its tmpfs still mounted) left by this very process
        with tempfile.TemporaryDirectory(dir=tmpdir, prefix="execwatch-phases-") as own:
            os.chmod(own, 0o755)
            done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True,
                                  text=True, cwd=HERE.parent, timeout=300,
                                  env={**os.environ, "TMPDIR": own})  # fmt: skip
        if done.returncode != 0:
            sys.exit(f"the phases of {subject.archive.name}: {done.stderr.strip()[-300:]}")
        runs.append(json.loads(done.stdout.splitlines()[-1]))
    spent = {name: min(run[name] for run in runs) for name in runs[0]}
    spent["start-up and imports"] = timed(start_up, count).min
    return spent


def start_up() -> None:
    subprocess.run([EXECWATCH, "scan", "--help"], capture_output=True, check=True)


def phases_child(argv: list[str]) -> None:
    """`execwatch ARGV` in this process, its forked children (the static scan's
    start_isolated, the runs' run_isolated) called in place, one after the other,
    each of PHASES timed: their seconds, and the total, as one JSON line on stdout."""
    spent: dict[str, float] = {}
    for name, (module, attr) in PHASES.items():
        mod = importlib.import_module(module)
        setattr(mod, attr, _timing(getattr(mod, attr), name, spent))
    for module, (attr, in_place) in IN_A_CHILD.items():
        setattr(importlib.import_module(module), attr, in_place)
    from execwatch.cli import main

    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        main(argv)
    spent["total in-process"] = time.perf_counter() - start
    print(json.dumps(spent))


def _in_place(work: Callable[[], T], limits: object, what: str) -> T:
    return work()


@dataclass
class _Finished:
    """What `start_isolated` returns, for work already done in place."""

    value: Any
    status: int | None = 0

    def result(self) -> Any:
        return self.value

    def cancel(self) -> None:
        pass


def _started_in_place(work: Callable[[], Any], limits: object, what: str) -> _Finished:
    return _Finished(work())


# what `phases_child` calls in place, by module: (the forking function, its stand-in)
IN_A_CHILD: dict[str, tuple[str, Callable[..., Any]]] = {
    "execwatch.scan.cli": ("start_isolated", _started_in_place),
    "execwatch.smoke.runs": ("run_isolated", _in_place),
}


def _timing(fn: Callable[..., Any], name: str, spent: dict[str, float]) -> Callable[..., Any]:
    def timed_fn(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[name] = spent.get(name, 0.0) + time.perf_counter() - start

    return timed_fn


# -- Docker's emulation ----------------------------------------------------------------------


@contextmanager
def host_binfmt(qemu: Path) -> Iterator[str]:
    """qemu-aarch64-static in the host's binfmt_misc table as tonistiigi/binfmt registers
    it (flags CF), under a name of this run; removed, and the table unmounted if this
    mounted it, however the block ends."""
    mounted = BINFMT.joinpath("register").exists()
    if not mounted:
        subprocess.run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT)], check=True)
    name = f"execwatch-bench-{os.getpid()}-qemu-aarch64"
    try:
        _, magic, mask, _ = QEMU["arm64"]
        hexed = ["".join(f"\\x{b:02x}" for b in field) for field in (magic, mask)]
        BINFMT.joinpath("register").write_text(f":{name}:M::{hexed[0]}:{hexed[1]}:{qemu}:CF")
        try:
            yield name
        finally:
            BINFMT.joinpath(name).write_text("-1")
    finally:
        if not mounted:
            subprocess.run(["umount", str(BINFMT)], check=True)


# -- one run of everything -------------------------------------------------------------------


def measure(
    dockerd: Dockerd, subject: Subject, args: argparse.Namespace, work: Path, qemu: Path
) -> dict[str, Any]:
    """Every tool on one platform, interleaved run by run (a load that comes and goes on
    a shared machine hits them alike): warm, cold and peak memory. For the emulated
    platform the host's binfmt_misc entry is registered around these runs."""
    report = work / "report.json"
    fns: dict[str, Callable[[], None]] = {
        "execwatch": lambda: run_execwatch(subject, report),
        "execwatch_tmpfs": lambda: run_execwatch(subject, report, TMPFS),
        "docker": lambda: run_docker(dockerd, subject),
    }
    out: dict[str, Any] = {"platform": subject.platform, "emulated": subject.emulated,
                           "archive_bytes": subject.archive.stat().st_size}  # fmt: skip
    with ExitStack() as emulation:
        if subject.emulated:
            emulation.enter_context(host_binfmt(qemu))
        for fn in fns.values():
            fn()  # the warm-up, discarded
        warm, cold = interleaved(fns, args.repeat), interleaved(fns, args.cold, drop_caches)
        for tool in fns:
            out[tool] = {"warm": warm[tool].doc(), "cold": cold[tool].doc()}
        out["docker"].update(first_after_load(dockerd, subject, args.cold))
        out["execwatch"]["memory"] = execwatch_memory(subject, report)
        out["docker"]["memory"] = docker_memory(dockerd, subject)
    out["execwatch"]["phases"] = phases(subject)
    out["execwatch_tmpfs"]["phases"] = phases(subject, TMPFS)
    return out


def interleaved(
    fns: dict[str, Callable[[], None]], count: int, before: Callable[[], None] | None = None
) -> dict[str, Times]:
    """`count` rounds, each running every fn once (after `before`): their wall times."""
    runs: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(count):
        for name, fn in fns.items():
            runs[name].extend(timed(fn, 1, before).runs)
    return {name: Times(times) for name, times in runs.items()}


def execwatch_memory(subject: Subject, report: Path) -> dict[str, float]:
    tree, largest = peak_memory(execwatch_argv(subject, report))
    return {"tree_peak_rss_mb": tree, "largest_process_mb": largest}


def docker_memory(dockerd: Dockerd, subject: Subject) -> dict[str, float]:
    idle = tree_rss_kb(process_table(), set(), str(dockerd.workdir)) / 1024
    tree, client = peak_memory(docker_argv(dockerd, subject), str(dockerd.workdir))
    return {"tree_peak_rss_mb": tree, "client_mb": client, "idle_daemons_mb": idle}


def first_after_load(dockerd: Dockerd, subject: Subject, count: int) -> dict[str, Any]:
    """The first run of a just-loaded image: `docker rmi`, caches dropped, `docker load`
    (timed apart), then the timed run."""
    loads: list[float] = []

    def reload() -> None:
        dockerd.docker("rmi", subject.tag)
        drop_caches()
        start = time.perf_counter()
        dockerd.docker("load", "-q", "-i", str(subject.archive))
        loads.append(time.perf_counter() - start)

    first = timed(lambda: run_docker(dockerd, subject), count, reload)
    with_load = Times([a + b for a, b in zip(loads, first.runs, strict=True)])
    return {"first_after_load": first.doc(), "load": Times(loads).doc(),
            "load_and_first_run": with_load.doc()}  # fmt: skip


def ratios(row: dict[str, Any]) -> dict[str, float]:
    ew, tmpfs, dk = row["execwatch"], row["execwatch_tmpfs"], row["docker"]
    return {
        "warm": ew["warm"]["median_s"] / dk["warm"]["median_s"],
        "cold": ew["cold"]["median_s"] / dk["cold"]["median_s"],
        "cold_vs_load_and_first_run": ew["cold"]["median_s"] / dk["load_and_first_run"]["median_s"],
        "tmpfs_warm": tmpfs["warm"]["median_s"] / dk["warm"]["median_s"],
        "tmpfs_cold": tmpfs["cold"]["median_s"] / dk["cold"]["median_s"],
        "memory": ew["memory"]["tree_peak_rss_mb"] / dk["memory"]["tree_peak_rss_mb"],
    }


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Build, start dockerd, load, measure both platforms, stop: the result document."""
    if os.geteuid() != 0:
        sys.exit("smoke_bench starts dockerd, drops caches and registers binfmt_misc: run as root")
    for need in ("dockerd", "docker", "skopeo"):
        if shutil.which(need) is None:
            sys.exit(f"{need} not found: run dev/setup.sh --test")
    qemu = EMULATORS / "qemu-aarch64-static"
    if not qemu.exists():
        sys.exit(f"{qemu} missing: run dev/setup.sh --test (dev/fetch-emulators.sh)")
    if not compileall.compile_dir(Path(execwatch.__file__).parent, quiet=1):
        sys.exit("cannot byte-compile execwatch")
    items = subjects(work)
    # a short path of its own: containerd's socket lies below it (unix sockets: 108 bytes)
    dockerd = Dockerd(Path(tempfile.mkdtemp(prefix="execwatch-dockerd-")))
    try:
        dockerd.start()
        for subject in items:
            dockerd.docker("load", "-q", "-i", str(subject.archive))
        rows = [measure(dockerd, subject, args, work, qemu) for subject in items]
        version = dockerd.docker("version", "--format", "{{.Server.Version}}").stdout.strip()
    finally:
        dockerd.stop()
        shutil.rmtree(dockerd.workdir, ignore_errors=True)
    for row in rows:
        row["execwatch_over_docker"] = ratios(row)
        row["target"] = TARGET_EMULATED if row["emulated"] else TARGET_NATIVE
    return {"docker_version": version, "repeat": args.repeat, "cold_runs": args.cold,
            "load_average": os.getloadavg(), "platforms": rows}  # fmt: skip


def print_table(result: dict[str, Any]) -> None:
    print(f"docker {result['docker_version']}; warm: median (min) of {result['repeat']} runs;"
          f" cold: caches dropped before each of {result['cold_runs']} runs")  # fmt: skip
    print(f"{'platform':12} {'tool':16} {'warm s':>15} {'cold s':>15} {'tree MB':>8}  notes")
    for row in result["platforms"]:
        for tool in ("execwatch", "execwatch_tmpfs", "docker"):
            t = row[tool]
            mem = f"{t['memory']['tree_peak_rss_mb']:8.1f}" if "memory" in t else f"{'':8}"
            print(f"{row['platform']:12} {tool:16}"
                  f" {t['warm']['median_s']:7.3f} ({t['warm']['min_s']:5.3f})"
                  f" {t['cold']['median_s']:7.3f} ({t['cold']['min_s']:5.3f})"
                  f" {mem}  {note(tool, t)}")  # fmt: skip
        for tool in ("execwatch", "execwatch_tmpfs"):
            spent = ", ".join(f"{k} {v:.3f}" for k, v in row[tool]["phases"].items())
            print(f"{'':12} {tool} phases (s): {spent}")
        r = row["execwatch_over_docker"]
        print(f"{'':12} execwatch/docker: warm {r['warm']:.2f}x, cold {r['cold']:.2f}x"
              f" (vs docker load + first run {r['cold_vs_load_and_first_run']:.2f}x);"
              f" TMPDIR on tmpfs warm {r['tmpfs_warm']:.2f}x, cold {r['tmpfs_cold']:.2f}x;"
              f" memory {r['memory']:.2f}x; target <= {row['target']}x")  # fmt: skip
    load = result["load_average"]
    print(f"load average {load[0]:.1f} (1 min) on {os.cpu_count()} CPUs")


def note(tool: str, t: dict[str, Any]) -> str:
    if tool == "execwatch":
        return f"largest process {t['memory']['largest_process_mb']:.1f} MB"
    if tool == "docker":
        return (f"idle dockerd + containerd {t['memory']['idle_daemons_mb']:.1f} MB, client"
                f" {t['memory']['client_mb']:.1f} MB; first run after load"
                f" {t['first_after_load']['median_s']:.3f} s, load"
                f" {t['load']['median_s']:.3f} s")  # fmt: skip
    return f"TMPDIR={TMPFS}"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=10, help="warm runs per tool (median)")
    parser.add_argument("--cold", type=int, default=3, help="cold runs per tool (median)")
    args = parser.parse_args(argv)
    if args.repeat < 1 or args.cold < 1:
        parser.error("--repeat and --cold take at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    with tempfile.TemporaryDirectory(prefix="execwatch-smoke-bench-") as tmp:
        work = Path(tmp)
        work.chmod(0o755)
        result = run(args, work)
    print_table(result)
    print(f"saved {save('smoke_bench', result)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
