"""Every way a program dies (or only exits) right after a successful exec, as one table.

Each case fills a root filesystem from real packages: the host's Debian files, trixie's
hello and curl (dev/fetch-newer.sh) and musl. The host test (test_early_deaths.py) runs
them under a chroot; the container tests run the same roots as runc and containerd
images, and the cluster test carries them to Events. A case says what the pipeline must
conclude, or that the kernel must send nothing at all.
"""

from __future__ import annotations

import shutil
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from execwatch.attribution import Attributor
from execwatch.node.stack import StackOptions
from execwatch.pipeline import PipelineOptions
from execwatch.probe.events import decode_record
from execwatch.probe.loader import ProbeOptions
from execwatch.record import QUIET_REASONS, EarlyDeath, ExecFailure, KernelEvent, Reason
from tests.support.node.stack_runner import Running, node_stack
from tests.support.probe.debian_roots import (
    MUSL_LOADER,
    build_musl,
    copy_into,
    gcompat_root,
    glibc_root,
    needed_libraries,
    newer_package,
)
from tests.support.runtime.runc import FOREIGN_BUSYBOX, HOST_BUSYBOX
from tests.support.wait import wait_until

KEEPALIVE = ["/busybox", "sleep", "300"]  # static: runs in every case's root
MARKER = "/foreign"  # an arm64 busybox: ENOEXEC, reported as ForeignArchitecture
LATE_MS = 3000  # past the probe's window in every test (1 s) and the agent's default (2 s)
CRASHER = "int main(int argc, char **argv) { return *(volatile int *)(long)(argc - 1); }\n"
EXITER = r"""
#include <stdlib.h>
#include <unistd.h>
int main(int argc, char **argv) {
    if (argc > 2) { usleep(atoi(argv[1]) * 1000); return atoi(argv[2]); }
    return 2;
}
"""


@dataclass(frozen=True)
class Death:
    """One case: how to build its root, what to run in it, and what must come of it."""

    name: str
    fill: Callable[[Path], Path]  # builds the root in an empty directory, returns it
    argv: tuple[str, ...]
    exit_code: int | None  # as the parent sees it (the loader's own code, measured here)
    reason: Reason | None  # None: the kernel sends no record at all
    signal: int | None = None
    details: dict[str, str] = field(default_factory=dict)  # Diagnosis field -> value

    @property
    def shown(self) -> bool:
        """Reported by default (trace lines, cluster records), not only counted."""
        return self.reason is not None and self.reason not in QUIET_REASONS

    @property
    def path(self) -> str:
        return self.argv[0]

    @property
    def exit_status(self) -> int:
        """What a container runtime reports: the exit code, or 128 + the signal."""
        return 128 + self.signal if self.signal is not None else self.exit_code or 0

    def build(self, root: Path) -> Path:
        root.mkdir(parents=True, exist_ok=True)
        return self.fill(root)

    def container_root(self, root: Path) -> Path:
        """The case's root, plus what a container of it needs: a static sleeper to keep it
        running (KEEPALIVE), a foreign binary whose failed exec marks a point in time
        (MARKER), and mount points."""
        self.build(root)
        shutil.copy2(HOST_BUSYBOX, root / KEEPALIVE[0].lstrip("/"))
        shutil.copy2(FOREIGN_BUSYBOX, root / MARKER.lstrip("/"))
        for mountpoint in ("proc", "dev", "sys"):
            (root / mountpoint).mkdir(exist_ok=True)
        return root

    def check(self, record: ExecFailure) -> None:
        """The record says what this case must say (its diagnosis and how it died)."""
        d, e = record.diagnosis, record.event
        assert d.reason is self.reason, (d.reason, d.detail)
        found = {name: getattr(d, name) for name in self.details}
        assert found == self.details, (found, d.detail)
        assert isinstance(e, EarlyDeath), e
        died = (e.path, e.exit_code, e.signal)
        assert died == (self.path, self.exit_code, self.signal), died
        assert e.age_ms is not None and 0 <= e.age_ms < 2000, e.age_ms


def ls_without_libselinux(root: Path) -> Path:
    return glibc_root(root, {"/usr/bin/ls": Path("/usr/bin/ls")}, omit=["libselinux.so.1"])


def newer_hello(root: Path) -> Path:
    """trixie's hello needs GLIBC_2.38; bookworm's libc.so.6 stops at 2.36."""
    return glibc_root(root, {"/usr/bin/hello": newer_package("hello") / "usr/bin/hello"})


def newer_curl(root: Path) -> Path:
    """trixie's curl imports curl_global_trace@CURL_OPENSSL_4, which bookworm's libcurl
    (the version node exists, the symbol does not) lacks: the version check passes."""
    host_libcurl = {"libcurl.so.4": Path("/usr/lib/x86_64-linux-gnu/libcurl.so.4")}
    return glibc_root(
        root,
        {"/usr/bin/curl": newer_package("curl") / "usr/bin/curl"},
        extra_libraries=host_libcurl | needed_libraries(host_libcurl["libcurl.so.4"]),
    )


def glibc_cxx_under_gcompat(root: Path) -> Path:
    return gcompat_root(root, loader_link=True)


def glibc_crasher(root: Path) -> Path:
    """A real fault, not kill(2): a container's init ignores signals other tasks send it."""
    crasher = build_musl(root.parent, f"{root.name}-crasher", CRASHER, compiler="gcc")
    return glibc_root(root, {"/usr/bin/crasher": crasher})


def dash(root: Path) -> Path:
    return glibc_root(root, {"/bin/sh": Path("/bin/sh")})


def grep_and_haystack(root: Path) -> Path:
    glibc_root(root, {"/usr/bin/grep": Path("/usr/bin/grep")})
    (root / "haystack").write_text("hay\n")
    return root


def musl_exiter(root: Path) -> Path:
    """musl's loader is its libc: every exit of this program comes from inside it."""
    copy_into(root, build_musl(root.parent, f"{root.name}-exiter", EXITER), "/usr/bin/exiter")
    copy_into(root, Path(MUSL_LOADER), MUSL_LOADER)
    return root


CURL_SYMBOL = {"symbol": "curl_global_trace", "version": "CURL_OPENSSL_4"}
DEATHS = [
    Death(
        "missing-library",
        ls_without_libselinux,
        ("/usr/bin/ls", "/"),
        127,  # "error while loading shared libraries"
        Reason.MISSING_LIBRARY,
        details={"library": "libselinux.so.1"},
    ),
    Death(
        "missing-symbol-version",
        newer_hello,
        ("/usr/bin/hello",),
        1,  # glibc's loader exits 1 for a missing version, not 127
        Reason.MISSING_SYMBOL_VERSION,
        details={"version": "GLIBC_2.38", "library": "/usr/lib/x86_64-linux-gnu/libc.so.6"},
    ),
    Death(
        "missing-symbol",
        newer_curl,
        ("/usr/bin/curl", "--version"),
        127,  # "symbol lookup error: undefined symbol"
        Reason.MISSING_SYMBOL,
        details={**CURL_SYMBOL, "library": "libcurl.so.4"},
    ),
    Death(
        "libc-mismatch",
        glibc_cxx_under_gcompat,
        ("/usr/bin/tbl",),
        127,  # musl's "Error relocating ...: symbol not found", not the seed's 139
        Reason.LIBC_MISMATCH,
        details={"interpreter": "/lib64/ld-linux-x86-64.so.2"},
    ),
    Death(
        "startup-crash",
        glibc_crasher,
        ("/usr/bin/crasher",),
        None,
        Reason.STARTUP_CRASH,
        signal=signal.SIGSEGV,
    ),
    # glibc programs exit through libc.so.6, never from inside ld.so: no record at all.
    Death("command-not-found", dash, ("/bin/sh", "-c", "no-such-command"), 127, None),
    Death(
        "grep-without-a-match",
        grep_and_haystack,
        ("/usr/bin/grep", "-q", "needle", "/haystack"),
        1,
        None,
    ),
    # musl: the kernel reports the quick exit 127; user space finds the binary sound.
    Death("musl-quick-127", musl_exiter, ("/usr/bin/exiter", "0", "127"), 127, Reason.BENIGN_EXIT),
    Death("musl-late-127", musl_exiter, ("/usr/bin/exiter", str(LATE_MS), "127"), 127, None),
]
BY_NAME = {death.name: death for death in DEATHS}


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
    """The node stack on the real probe, polled all the time as the agent polls it, and
    what the kernel sent and what came out."""

    def __init__(
        self, running: Running, observed: Observed, kernel_events: list[KernelEvent]
    ) -> None:
        self.probe = running.probe
        self.pipeline = running.pipeline
        self.records = running.records
        self.observed = observed
        self.kernel_events = kernel_events  # whose record the kernel sent at all

    @classmethod
    @contextmanager
    def open(
        cls,
        *,
        show_crashes: bool,
        attributor: Attributor | None = None,
        death_window_s: float | None = None,
    ) -> Iterator[DeathTracer]:
        observed = Observed()
        kernel_events: list[KernelEvent] = []

        def tap(raw: bytes, on_record: Callable[[bytes], None]) -> None:
            kernel_events.append(decode_record(raw, 0))
            on_record(raw)

        probe = ProbeOptions()
        if death_window_s is not None:
            probe = ProbeOptions(death_window_ms=death_window_s * 1000)
        options = StackOptions(
            probe=probe,
            pipeline=PipelineOptions(window=0.05, show_crashes=show_crashes),
            attributor=attributor,
            observer=observed,
            tap=tap,
        )
        with node_stack(options, loop="poll") as running:
            yield cls(running, observed, kernel_events)

    @property
    def kernel_pids(self) -> list[int]:
        return [event.tgid for event in self.kernel_events]

    def settle(self, seconds: float = 0.5) -> None:
        time.sleep(seconds)
        self.pipeline.drain(5.0)

    def wait_for(self, match: Callable[[ExecFailure], bool], timeout: float = 5.0) -> ExecFailure:
        def found() -> ExecFailure | None:
            self.settle(0.1)
            return next((r for r in self.records if match(r)), None)

        def seen() -> str:
            seen = [
                (r.event.path, r.event.status, str(r.diagnosis.reason), r.attribution.container_id)
                for r in self.records
                if isinstance(r.event, EarlyDeath)
            ]
            return f"no matching early death; saw {seen[-20:]}"

        record: ExecFailure = wait_until(found, timeout, step=0, explain=seen)
        return record

    def for_pid(self, pid: int, timeout: float = 5.0) -> ExecFailure:
        return self.wait_for(lambda r: r.event.tgid == pid, timeout)

    def none_shown(self, pids: set[int]) -> None:
        self.settle(0.5)
        assert not [r for r in self.records if r.event.tgid in pids]

    def none_sent(self, pids: set[int]) -> None:
        """Not even a ring-buffer record: the kernel discarded these exits."""
        self.none_shown(pids)
        assert not pids & set(self.kernel_pids)
