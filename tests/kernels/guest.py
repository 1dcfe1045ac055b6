"""Runs inside a matrix guest (see vm.py), as root on the kernel under test.

    python -m tests.kernels.guest OUT_DIR

Starts the real `execwatch trace --json --metrics-address ...`, causes the real
failures of CASES, then registers Debian's qemu-aarch64-static in the guest's own
binfmt_misc and runs Debian's arm64 busybox through it (an exec that succeeds, under
emulation), waits for their records, reads the kernel's exact counts from the metrics
endpoint, stops trace with SIGTERM and writes OUT_DIR/result.json for test_matrix.py to
judge. Few imports: every import costs seconds under TCG.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from tests.support.binfmt.emulation import EMULATORS, TABLE_IN_NAMESPACE, aarch64_entry
from tests.support.probe.debian_roots import Keepers, glibc_root

REPO = Path(__file__).resolve().parents[2]
FOREIGN_HELLO = REPO / ".cache/foreign/arm64/root/usr/bin/hello"
MUSL_LOADER = Path("/lib/ld-musl-x86_64.so.1")
GLIBC_TRUE = Path("/usr/bin/true")
BUSYBOX = Path("/bin/busybox")
PORT = 9477
FOREIGN_TRIES = 3
BUSYBOX_ARM64 = REPO / ".cache/foreign/arm64/root/usr/bin/busybox"
EMULATED_TRIES = 3
MISSING = "libselinux.so.1"


def build_musl_root(root: Path) -> None:
    """An alpine-like root: busybox as /bin/sh, musl's loader, and one glibc binary."""
    for d in ("bin", "lib", "usr/bin"):
        (root / d).mkdir(parents=True)
    shutil.copy(BUSYBOX, root / "bin/busybox")
    (root / "bin/sh").symlink_to("busybox")
    shutil.copy(MUSL_LOADER.resolve(), root / "lib" / MUSL_LOADER.name)
    shutil.copy(GLIBC_TRUE, root / "usr/bin/app")


def cause_failures(work: Path, keepers: Keepers) -> dict[str, str]:
    """Each case once (the foreign binary FOREIGN_TRIES times); returns case -> path."""
    # On the guest's tmpfs: under TCG on a loaded host one 9p read can outlast the
    # diagnosis budget, and the matrix is about the kernel, not about 9p.
    foreign = work / "hello-arm64"
    shutil.copy(FOREIGN_HELLO, foreign)
    for _ in range(FOREIGN_TRIES):
        try_exec([str(foreign)])
    root = work / "musl-root"
    build_musl_root(root)
    # The shell stays a second: its root is where the failing child's file is looked up.
    # (`busybox sleep`, not `sleep`: the applet would re-exec /proc/self/exe, absent here.)
    subprocess.run(
        ["/usr/sbin/chroot", root, "/bin/sh", "-c", "/usr/bin/app; /bin/busybox sleep 1"]
    )
    # Early death: the exec succeeds, glibc's loader then misses a library and exits 127.
    no_selinux = glibc_root(
        work / "no-selinux", {"/usr/bin/ls": Path("/usr/bin/ls")}, omit=[MISSING]
    )
    keepers.run(["/usr/bin/ls", "/"], root=no_selinux, linger=15)
    script = work / "run.sh"
    script.write_text("#!/opt/nowhere/bash -e\necho hi\n")
    script.chmod(0o755)
    try_exec([str(script)])
    return {
        "foreign": str(foreign),
        "glibc_in_musl_root": "/usr/bin/app",
        "missing_shebang_interpreter": str(script),
        "missing_library": "/usr/bin/ls",
    }


def cause_emulation(work: Path, result: dict[str, object]) -> str:
    """After the failures (the arm64 binary above must fail first): qemu-aarch64-static
    registered with F in the guest's binfmt_misc, which root mounts directly on every
    kernel; once trace watches it (its metric), busybox runs EMULATED_TRIES times."""
    busybox, qemu = work / "busybox-arm64", work / "qemu-aarch64-static"
    shutil.copy(BUSYBOX_ARM64, busybox)
    shutil.copy(EMULATORS / "qemu-aarch64-static", qemu)
    table = Path(TABLE_IN_NAMESPACE)
    subprocess.run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(table)], check=True)
    (table / "register").write_text(aarch64_entry("qemu-aarch64", qemu, "F"))
    result["emulator_watched"] = wait_for_metric(
        'execwatch_node_binfmt_emulators{emulated_arch="arm64"', 60
    )
    ran = [subprocess.run([str(busybox), "echo", "emulated"], capture_output=True, text=True)
           for _ in range(EMULATED_TRIES)]  # fmt: skip
    result["emulated_runs"] = [(r.returncode, r.stdout) for r in ran]
    return str(busybox)


def wait_for_metric(prefix: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = urllib.request.urlopen(f"http://127.0.0.1:{PORT}/metrics", timeout=10).read()
        if any(line.startswith(prefix) for line in body.decode().splitlines()):
            return True
        time.sleep(0.5)
    return False


def warm_up(stdout: Lines) -> str | None:
    """One failure (EACCES) on a mount of its own (/run), before the cases: trace's first
    diagnosis pays for imports that, under TCG on a loaded host, can outlast the
    diagnosis budget, and a mount where one overran is not diagnosed again."""
    target = Path("/run/warm-up")
    target.write_text("not executable\n")
    try_exec([str(target)])
    stdout.wait_for(lambda ls: any(str(target) in x for x in ls), 60)
    found = [json.loads(x) for x in stdout.lines if str(target) in x]
    return str(found[0]["reason"]) if found else None


def try_exec(argv: list[str]) -> None:
    with contextlib.suppress(OSError):  # the failure is the point
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


class Lines:
    """Collects a pipe's lines on a thread, so waiting on them has a deadline."""

    def __init__(self, stream: IO[str] | None) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: IO[str] | None) -> None:
        for line in stream or ():
            self.lines.append(line)

    def wait_for(self, done: Callable[[list[str]], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if done(self.lines):
                return True
            time.sleep(0.2)
        return False


def scrape() -> dict[str, float]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{PORT}/metrics", timeout=10).read().decode()
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in body.splitlines()
        if line.startswith("execwatch_kernel")
    }


def records_cover(paths: dict[str, str]) -> Callable[[list[str]], bool]:
    def done(lines: list[str]) -> bool:
        records = [json.loads(line) for line in lines if line.startswith("{")]
        foreign = sum(r["count"] for r in records if r["path"] == paths["foreign"])
        emulated = sum(r["count"] for r in records if r["path"] == paths["emulated"])
        seen = {r["path"] for r in records}
        tries = foreign == FOREIGN_TRIES and emulated == EMULATED_TRIES
        return tries and set(paths.values()) <= seen

    return done


@contextlib.contextmanager
def tracing(out: Path, argv: list[str]) -> Iterator[tuple[dict[str, object], Lines]]:
    """`execwatch trace ARGV --metrics-address ...`, once it traces and is warmed up: yields
    the result to fill and trace's stdout; then reads the kernel's counts, stops trace with
    SIGTERM and writes OUT/result.json with its records, stderr and exit status."""
    result: dict[str, object] = {"release": os.uname().release}
    trace = subprocess.Popen(
        [sys.executable, "-m", "execwatch.cli", *argv, "--metrics-address", f"127.0.0.1:{PORT}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stdout, stderr = Lines(trace.stdout), Lines(trace.stderr)
    t0 = time.monotonic()
    try:
        if not stderr.wait_for(lambda ls: any("tracing failed execs" in x for x in ls), 240):
            raise RuntimeError("trace did not start")
        result["trace_start_s"] = round(time.monotonic() - t0, 1)
        result["warm_up"] = warm_up(stdout)
        yield result, stdout
        result["kernel_counts"] = scrape()
    finally:
        trace.send_signal(signal.SIGTERM)
        try:
            result["trace_rc"] = trace.wait(timeout=60)
        except subprocess.TimeoutExpired:
            trace.kill()
            result["trace_rc"] = trace.wait()
        time.sleep(0.2)  # the reader threads take the last lines
        result["records"] = [json.loads(x) for x in stdout.lines if x.startswith("{")]
        result["stderr"] = stderr.lines
        (out / "result.json").write_text(json.dumps(result, indent=1))


def main() -> int:
    # A diagnosis takes a millisecond on a node, and much longer in a starved TCG guest.
    argv = ["trace", "--json", "--window", "0.2", "--show-not-found", "--diagnosis-budget", "60"]
    with tracing(Path(sys.argv[1]), argv) as (result, stdout):
        keepers = Keepers()  # a missing library's caller lingers: the root is looked up there
        with tempfile.TemporaryDirectory() as work:
            paths = cause_failures(Path(work), keepers)
            paths["emulated"] = cause_emulation(Path(work), result)
            result["cases"] = paths
            result["all_records_seen"] = stdout.wait_for(records_cover(paths), 60)
            keepers.reap()
    return 0


if __name__ == "__main__":
    sys.exit(main())
