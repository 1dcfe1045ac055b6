"""Processes that die right after a successful exec, caught by the real probe and diagnosed.

Every failure is caused for real: real Debian binaries in roots built from the host's
real libraries (one left out, or the wrong C library's loader), binaries of a newer
Debian release against the host's older glibc and libcurl, and real programs that
crash or exit. The loader's own exit code is recorded and asserted, as users see it.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from execwatch.diagnosis import FileDiagnoser
from execwatch.pipeline import NodePipeline
from execwatch.probe import Probe
from execwatch.probe.events import boot_to_epoch_offset, decode_record
from execwatch.probe.loader import ProbeOptions
from execwatch.record import ExecFailure, Reason
from tests.probe.roots import (
    MUSL_LOADER,
    Keepers,
    build_musl,
    copy_into,
    glibc_root,
    keepers,
    needed_libraries,
    newer_package,
)
from tests.probe.test_trace_cli import TraceProcess, start_trace

__all__ = ["keepers", "start_trace"]
WINDOW_S = 1.0


class Observed:
    """Every record the pipeline delivered (counted), and the ones it emitted (shown)."""

    def __init__(self) -> None:
        self.counted: list[tuple[int | str, Reason]] = []

    def delivered(self, errno: int | str, reason: Reason, *, aggregated: bool, **_: object) -> None:
        self.counted.append((errno, reason))

    def reasons(self) -> set[Reason]:
        return {reason for _, reason in self.counted}

    def dropped(self, kind: str, count: int = 1) -> None: ...

    def overran(self, stage: str) -> None: ...


class DeathTracer:
    def __init__(self, probe: Probe, *, show_crashes: bool) -> None:
        self.probe = probe
        self.records: list[ExecFailure] = []
        self.observed = Observed()
        self.pipeline = NodePipeline(
            FileDiagnoser.for_host(None),
            self.records.append,
            epoch_offset=boot_to_epoch_offset(),
            observer=self.observed,
            show_crashes=show_crashes,
            window=0.05,
        )
        self.kernel_pids: list[int] = []  # whose record the kernel sent at all
        probe.open_ring_buffer(self._on_record)

    def _on_record(self, raw: bytes) -> None:
        self.kernel_pids.append(decode_record(raw, 0).tgid)
        self.pipeline.on_record(raw)

    def settle(self, seconds: float = 0.5) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.probe.poll(50)
        drain = getattr(self.pipeline, "drain", None)
        if drain is not None:
            drain(5.0)

    def for_pid(self, pid: int, timeout: float = 5.0) -> ExecFailure:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.settle(0.1)
            for record in self.records:
                if record.event.tgid == pid:
                    return record
        seen = [(r.event.path, r.event.status, str(r.diagnosis.reason)) for r in self.records]
        raise AssertionError(f"no early death of pid {pid} within {timeout}s; saw {seen[-20:]}")

    def none_shown(self, pids: set[int]) -> None:
        self.settle(0.5)
        assert not [r for r in self.records if r.event.tgid in pids]

    def none_sent(self, pids: set[int]) -> None:
        """Not even a ring-buffer record: the kernel discarded these exits."""
        self.none_shown(pids)
        assert not pids & set(self.kernel_pids)


@pytest.fixture
def tracer() -> Iterator[DeathTracer]:
    with Probe(ProbeOptions(death_window_ms=WINDOW_S * 1000)) as probe:
        tracer = DeathTracer(probe, show_crashes=False)
        yield tracer
        getattr(tracer.pipeline, "close", lambda: None)()


@pytest.fixture
def crash_tracer() -> Iterator[DeathTracer]:
    with Probe(ProbeOptions(death_window_ms=WINDOW_S * 1000)) as probe:
        tracer = DeathTracer(probe, show_crashes=True)
        yield tracer
        getattr(tracer.pipeline, "close", lambda: None)()


def test_debian_binary_without_one_of_its_libraries(
    tracer: DeathTracer, keepers: Keepers, tmp_path: Path
) -> None:
    root = glibc_root(tmp_path, {"/usr/bin/ls": Path("/usr/bin/ls")}, omit=["libselinux.so.1"])

    ran = keepers.run(["/usr/bin/ls", "/"], root=root)

    assert ran.exit_code == 127  # "error while loading shared libraries"
    record = tracer.for_pid(ran.pid)
    assert record.diagnosis.reason is Reason.MISSING_LIBRARY
    assert record.diagnosis.library == "libselinux.so.1"
    e = record.event
    assert (e.path, e.exit_code, e.signal, e.errno) == ("/usr/bin/ls", 127, None, 0)
    assert e.comm == "ls" and e.ppid != os.getpid()  # the keeper inside the root
    st = os.stat(root / "usr/bin/ls")
    assert (e.exe_ino, e.exe_dev) == (st.st_ino, st.st_dev)
    assert e.age_ms is not None and 0 <= e.age_ms < WINDOW_S * 1000
    assert e.root_ino == os.stat(root).st_ino
    assert e.mntns == os.stat("/proc/self/ns/mnt").st_ino and e.cgroup_id > 0
    assert record.to_json()["library"] == "libselinux.so.1"
    assert record.to_json()["exit_code"] == 127 and record.to_json()["errno"] == "EXIT127"


def test_newer_debian_binary_against_the_hosts_older_glibc(
    tracer: DeathTracer, keepers: Keepers, tmp_path: Path
) -> None:
    """trixie's hello needs GLIBC_2.38; bookworm's libc.so.6 stops at 2.36."""
    hello = newer_package("hello") / "usr/bin/hello"
    root = glibc_root(tmp_path, {"/usr/bin/hello": hello})

    ran = keepers.run(["/usr/bin/hello"], root=root)

    assert ran.exit_code == 1  # glibc's loader exits 1 for a missing version, not 127
    record = tracer.for_pid(ran.pid)
    assert record.diagnosis.reason is Reason.MISSING_SYMBOL_VERSION
    assert record.diagnosis.version == "GLIBC_2.38"
    assert record.diagnosis.library is not None and record.diagnosis.library.endswith("libc.so.6")
    assert record.event.exit_code == 1


def gcompat_root(root: Path, *, loader_link: bool) -> Path:
    """A musl root holding a glibc C++ program; with loader_link, gcompat's
    /lib64/ld-linux-x86-64.so.2 -> musl's loader."""
    glibc_root(root, {"/usr/bin/tbl": Path("/usr/bin/tbl")})
    os.remove(root / "lib64/ld-linux-x86-64.so.2")
    copy_into(root, Path(MUSL_LOADER).resolve(), MUSL_LOADER)
    if loader_link:
        os.symlink(MUSL_LOADER, root / "lib64/ld-linux-x86-64.so.2")
    (root / "etc").mkdir()
    (root / "etc/ld-musl-x86_64.path").write_text("/usr/lib/x86_64-linux-gnu\n")
    return root


def test_glibc_cxx_binary_under_musls_loader_named_like_glibcs(
    tracer: DeathTracer, keepers: Keepers, tmp_path: Path
) -> None:
    """gcompat's layout: /lib64/ld-linux-x86-64.so.2 is musl's loader."""
    root = gcompat_root(tmp_path, loader_link=True)

    ran = keepers.run(["/usr/bin/tbl"], root=root)

    assert (ran.exit_code, ran.signal) == (127, None)  # "Error relocating ...: symbol not found"
    record = tracer.for_pid(ran.pid)
    assert record.diagnosis.reason is Reason.LIBC_MISMATCH
    assert record.diagnosis.interpreter == "/lib64/ld-linux-x86-64.so.2"
    assert "musl" in record.diagnosis.detail


def test_trace_tells_the_seeds_two_symptoms_apart(
    start_trace: Callable[..., TraceProcess], keepers: Keepers, tmp_path: Path
) -> None:
    """The second seed: the glibc image variant without its loader (exec fails, 127) and
    the glibc-compat variant (the exec succeeds, the loader gives up)."""
    plain = gcompat_root(tmp_path / "alpine", loader_link=False)
    compat = gcompat_root(tmp_path / "alpine-gcompat", loader_link=True)
    trace = start_trace("--json", "--no-attribution")

    missing = keepers.run(["/usr/bin/tbl"], root=plain)
    mismatch = keepers.run(["/usr/bin/tbl"], root=compat)
    time.sleep(1.0)
    code, out = trace.stop()

    assert (missing.exit_code, mismatch.exit_code) == (255, 127)  # 255: our execv raised
    lines = [json.loads(line) for line in out.splitlines()]
    by_reason = {line["reason"]: line for line in lines if line["path"] == "/usr/bin/tbl"}
    assert by_reason["MissingInterpreter"]["errno"] == "ENOENT"
    assert by_reason["MissingInterpreter"]["pid"] == missing.pid
    assert by_reason["LibcMismatch"]["errno"] == "EXIT127"
    assert by_reason["LibcMismatch"]["pid"] == mismatch.pid
    assert by_reason["LibcMismatch"]["exit_code"] == 127
    assert by_reason["LibcMismatch"]["age_ms"] < 2000
    assert code == 0


def test_unrelated_startup_crash_is_shown_only_when_asked(
    tracer: DeathTracer, crash_tracer: DeathTracer, keepers: Keepers
) -> None:
    ran = keepers.run(["/bin/sh", "-c", "kill -SEGV $$"])

    assert ran.signal == signal.SIGSEGV
    record = crash_tracer.for_pid(ran.pid)
    assert record.diagnosis.reason is Reason.STARTUP_CRASH
    assert (record.event.signal, record.event.exit_code) == (signal.SIGSEGV, None)
    assert record.event.status == "SIGSEGV" and record.event.path == "/usr/bin/dash"
    tracer.none_shown({ran.pid})
    assert ran.pid in tracer.kernel_pids
    assert Reason.STARTUP_CRASH in tracer.observed.reasons()


def test_ordinary_exits_cost_no_record(
    tracer: DeathTracer, keepers: Keepers, tmp_path: Path
) -> None:
    """glibc programs exit through libc.so.6, never from inside ld.so: no record at all."""
    (tmp_path / "haystack").write_text("hay\n")
    grep = keepers.run(["/usr/bin/grep", "-q", "needle", str(tmp_path / "haystack")])
    shell = keepers.run(["/bin/sh", "-c", "no-such-command"])
    assert (grep.exit_code, shell.exit_code) == (1, 127)

    tracer.none_sent({grep.pid, shell.pid})


def test_musl_command_not_found_is_counted_benign_never_shown(
    tracer: DeathTracer, keepers: Keepers, tmp_path: Path
) -> None:
    """musl's loader is its libc: every exit comes from inside it, so the kernel reports
    a quick exit 127 and user space finds nothing wrong with the binary."""
    program = build_musl(tmp_path, "exiter", EXITER)

    quick = keepers.run([str(program), "0", "127"])
    late = keepers.run([str(program), str(int(WINDOW_S * 1500)), "127"])

    assert (quick.exit_code, late.exit_code) == (127, 127)
    tracer.none_shown({quick.pid})
    tracer.none_sent({late.pid})  # past the window: the kernel does not report it
    assert quick.pid in tracer.kernel_pids
    assert Reason.BENIGN_EXIT in tracer.observed.reasons()


EXITER = r"""
#include <stdlib.h>
#include <unistd.h>
int main(int argc, char **argv) {
    if (argc > 2) { usleep(atoi(argv[1]) * 1000); return atoi(argv[2]); }
    return 2;
}
"""


def test_binary_linked_against_a_newer_libcurl(
    tracer: DeathTracer, keepers: Keepers, tmp_path: Path
) -> None:
    """trixie's curl imports curl_global_trace@CURL_OPENSSL_4, which bookworm's libcurl
    (the version node exists, the symbol does not) lacks: the version check passes."""
    curl = newer_package("curl") / "usr/bin/curl"
    host_libcurl = {"libcurl.so.4": Path("/usr/lib/x86_64-linux-gnu/libcurl.so.4")}
    root = glibc_root(
        tmp_path,
        {"/usr/bin/curl": curl},
        extra_libraries=host_libcurl | needed_libraries(host_libcurl["libcurl.so.4"]),
    )

    ran = keepers.run(["/usr/bin/curl", "--version"], root=root)

    assert ran.exit_code == 127  # "symbol lookup error: undefined symbol"
    record = tracer.for_pid(ran.pid)
    assert record.diagnosis.reason is Reason.MISSING_SYMBOL
    d = record.diagnosis
    assert (d.symbol, d.version, d.library) == (
        "curl_global_trace",
        "CURL_OPENSSL_4",
        "libcurl.so.4",
    )
