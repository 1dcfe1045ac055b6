"""Processes that die right after a successful exec, caught by the real probe and diagnosed.

Every failure is caused for real: real Debian binaries in roots built from the host's
real libraries (one left out, or the wrong C library's loader), binaries of a newer
Debian release against the host's older glibc and libcurl, and real programs that
crash or exit. The loader's own exit code is recorded and asserted, as users see it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from execwatch.record import EarlyDeath, Reason
from tests.probe.test_trace_cli import TraceProcess, start_trace
from tests.support.probe.deaths import BY_NAME, EXITER, DeathTracer
from tests.support.probe.debian_roots import (
    Keepers,
    build_musl,
    gcompat_root,
    keepers,
    needed_libraries,
)

__all__ = ["keepers", "start_trace"]
WINDOW_S = 1.0


@pytest.fixture
def tracer() -> Iterator[DeathTracer]:
    with DeathTracer.open(show_crashes=False, death_window_s=WINDOW_S) as tracer:
        yield tracer


@pytest.fixture
def crash_tracer() -> Iterator[DeathTracer]:
    with DeathTracer.open(show_crashes=True, death_window_s=WINDOW_S) as tracer:
        yield tracer


def test_debian_binary_without_one_of_its_libraries(
    tracer: DeathTracer, keepers: Keepers, tmp_path: Path
) -> None:
    root = BY_NAME["missing-library"].build(tmp_path)

    ran = keepers.run(["/usr/bin/ls", "/"], root=root)

    assert ran.exit_code == 127  # "error while loading shared libraries"
    record = tracer.for_pid(ran.pid)
    assert record.diagnosis.reason is Reason.MISSING_LIBRARY
    assert record.diagnosis.library == "libselinux.so.1"
    e = record.event
    assert isinstance(e, EarlyDeath), e
    assert (e.path, e.exit_code, e.signal) == ("/usr/bin/ls", 127, None)
    assert e.comm == "ls" and e.ppid != os.getpid()  # the keeper inside the root
    st = os.stat(root / "usr/bin/ls")
    assert (e.exe_ino, e.exe_dev) == (st.st_ino, st.st_dev)
    assert e.age_ms is not None and 0 <= e.age_ms < WINDOW_S * 1000
    assert e.root_ino == os.stat(root).st_ino
    assert e.mntns == os.stat("/proc/self/ns/mnt").st_ino and e.cgroup_id > 0
    assert record.to_json()["library"] == "libselinux.so.1"
    assert record.to_json()["exit_code"] == 127 and record.to_json()["errno"] == "EXIT127"


def test_a_retry_after_fixing_one_library_names_the_next_one(
    tracer: DeathTracer, keepers: Keepers, tmp_path: Path
) -> None:
    """The same binary in the same root dies again 3 s later, for another library: the
    diagnosis of the first death is not reused for the second."""
    root = BY_NAME["missing-library"].build(tmp_path)
    first = keepers.run(["/usr/bin/ls", "/"], root=root)
    assert tracer.for_pid(first.pid).diagnosis.library == "libselinux.so.1"

    libraries = root / "usr/lib/x86_64-linux-gnu"
    shutil.copy2(needed_libraries("/usr/bin/ls")["libselinux.so.1"], libraries)
    (libraries / "libpcre2-8.so.0").unlink()  # what libselinux needs
    time.sleep(3)
    second = keepers.run(["/usr/bin/ls", "/"], root=root)

    assert second.exit_code == 127
    record = tracer.for_pid(second.pid)
    assert record.diagnosis.reason is Reason.MISSING_LIBRARY
    assert record.diagnosis.library == "libpcre2-8.so.0"


def test_newer_debian_binary_against_the_hosts_older_glibc(
    tracer: DeathTracer, keepers: Keepers, tmp_path: Path
) -> None:
    """trixie's hello needs GLIBC_2.38; bookworm's libc.so.6 stops at 2.36."""
    root = BY_NAME["missing-symbol-version"].build(tmp_path)

    ran = keepers.run(["/usr/bin/hello"], root=root)

    assert ran.exit_code == 1  # glibc's loader exits 1 for a missing version, not 127
    record = tracer.for_pid(ran.pid)
    assert record.diagnosis.reason is Reason.MISSING_SYMBOL_VERSION
    assert record.diagnosis.version == "GLIBC_2.38"
    assert record.diagnosis.library is not None and record.diagnosis.library.endswith("libc.so.6")
    assert isinstance(record.event, EarlyDeath) and record.event.exit_code == 1


def test_glibc_cxx_binary_under_musls_loader_named_like_glibcs(
    tracer: DeathTracer, keepers: Keepers, tmp_path: Path
) -> None:
    """gcompat's layout: /lib64/ld-linux-x86-64.so.2 is musl's loader."""
    root = BY_NAME["libc-mismatch"].build(tmp_path)

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
    assert isinstance(record.event, EarlyDeath)
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


def test_binary_linked_against_a_newer_libcurl(
    tracer: DeathTracer, keepers: Keepers, tmp_path: Path
) -> None:
    """trixie's curl imports curl_global_trace@CURL_OPENSSL_4, which bookworm's libcurl
    (the version node exists, the symbol does not) lacks: the version check passes."""
    root = BY_NAME["missing-symbol"].build(tmp_path)

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
