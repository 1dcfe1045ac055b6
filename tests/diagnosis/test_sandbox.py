"""Diagnosis runs in worker processes that are really stopped (issue 24, item 2).

Each test runs the node pipeline with real worker processes: a diagnosis that allocates
without bound, loops, burns CPU or crashes kills its worker, is reported Undiagnosed with
the cause and counted once, and the pool is back at full strength for the next one.
"""

from __future__ import annotations

import os
import resource
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from execwatch.diagnosis.sandbox import SandboxLimits
from execwatch.diagnosis.startup import explain
from execwatch.pipeline import NodePipeline
from execwatch.record import Diagnosis, ExecFailure, KernelEvent, Reason
from execwatch.runnable.liveroot import RootView
from execwatch.runnable.openat2 import Root
from execwatch.serving.exposition import serve
from tests.support.binfmt.elfbuild import ElfSpec, build_elf
from tests.support.node.pipeline import make_pipeline
from tests.support.wait import wait_until
from tests.test_pipeline import Observer, raw_event

MiB = 1 << 20
BUDGET = 0.05  # the deadline of a running call is ten budgets: 0.5 s
GLIBC_LOADER = "/lib64/ld-linux-x86-64.so.2"


class Hostile:
    """Misbehaves according to the path; answers with its worker's pid otherwise."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root

    def diagnose(self, event: KernelEvent) -> Diagnosis:
        name = Path(event.path).name
        if name.startswith("hog"):
            hoard = []
            while True:
                hoard.append(bytearray(8 * MiB))
        if name.startswith("spin"):
            while True:
                pass
        if name.startswith("burn"):  # 0.4 CPU seconds, then an answer
            until = time.process_time() + 0.4
            while time.process_time() < until:
                pass
        if name == "segv":
            os.kill(os.getpid(), signal.SIGSEGV)
        if name == "app" and self.root is not None:
            return self._linker(self.root)
        return Diagnosis(Reason.FOREIGN_ARCHITECTURE, "amd64", "arm64", detail=str(os.getpid()))

    @staticmethod
    def _linker(root: Path) -> Diagnosis:
        """What the node does for an early death: the root's own linker on /app."""
        handle = Root(os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC), str(root))
        try:
            view = RootView(handle)
            node = view.node("/app")
            assert node is not None and node.elf is not None
            finding = explain(view, "/app", node.elf)
        finally:
            handle.close()
        reason = finding.reason if finding is not None else Reason.UNDIAGNOSED
        return Diagnosis(Reason(reason), "amd64", library=getattr(finding, "library", None))


Make = Callable[..., tuple[NodePipeline, list[ExecFailure], Observer]]


@pytest.fixture
def make(pipelines: list[NodePipeline]) -> Make:
    def build(diagnoser: object, **kw: object) -> tuple[NodePipeline, list[ExecFailure], Observer]:
        emitted: list[ExecFailure] = []
        observer = Observer()
        options: dict[str, object] = {"budget": BUDGET, "observer": observer, **kw}
        p = make_pipeline(diagnoser, emitted.append, **options)
        pipelines.append(p)
        return p, emitted, observer

    return build


def diagnose(p: NodePipeline, emitted: list[ExecFailure], path: bytes) -> Diagnosis:
    before = len(emitted)
    p.on_record(raw_event(path))
    assert p.drain(30.0), f"{path!r} was never settled"
    assert len(emitted) == before + 1
    return emitted[-1].diagnosis


def answers(p: NodePipeline, emitted: list[ExecFailure]) -> int:
    """A normal diagnosis still works: the pid of the worker that made it."""
    d = diagnose(p, emitted, b"/ok-%d" % time.monotonic_ns())
    assert d.reason is Reason.FOREIGN_ARCHITECTURE, d
    return int(d.detail)


def children() -> set[int]:
    found: set[int] = set()
    for task in Path("/proc/self/task").iterdir():
        found |= {int(pid) for pid in (task / "children").read_text().split()}
    return found


def dead(pid: int) -> bool:
    """Exited: a zombie not reaped yet, or gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_the_worker_is_a_reused_child_process(make: Make) -> None:
    p, emitted, _ = make(Hostile())
    first = answers(p, emitted)
    assert first != os.getpid() and first in children()
    pids = {answers(p, emitted) for _ in range(20)}
    assert len(pids) <= 2 and pids <= children()  # two processes, reused call after call
    assert p.diagnosis_capacity() == 2
    for pid in pids:  # the OOM killer takes a worker before the agent
        assert Path(f"/proc/{pid}/oom_score_adj").read_text() == "1000\n"


def test_a_diagnosis_that_allocates_without_bound_is_stopped_by_rlimit_as(make: Make) -> None:
    p, emitted, observer = make(Hostile(), budget=1.0, limits=SandboxLimits(memory=64 * MiB))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    d = diagnose(p, emitted, b"/hog")
    assert d.reason is Reason.UNDIAGNOSED
    assert d.detail == "diagnosis killed: over its memory budget (64 MiB)"
    assert observer.overruns == ["diagnosis_memory"]
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss < 16 * 1024  # KiB
    answers(p, emitted)
    assert p.diagnosis_capacity() == 2


def test_a_diagnosis_that_loops_forever_is_killed_at_its_deadline(make: Make) -> None:
    p, emitted, observer = make(Hostile())
    started = time.monotonic()
    d = diagnose(p, emitted, b"/spin")
    took = time.monotonic() - started
    assert d.detail == "diagnosis killed: over 0.5 s"
    assert 0.5 <= took < 5.0
    assert observer.overruns == ["diagnosis"]
    answers(p, emitted)


def test_ten_killed_diagnoses_in_a_row_leave_the_pool_at_full_strength(make: Make) -> None:
    p, emitted, observer = make(Hostile())
    workers = children()
    for i in range(10):
        p.on_record(raw_event(b"/spin-%d" % i))
    assert p.drain(30.0)
    assert [f.diagnosis.detail for f in emitted] == ["diagnosis killed: over 0.5 s"] * 10
    assert observer.overruns == ["diagnosis"] * 10  # each counted exactly once
    assert p.diagnosis_capacity() == 2
    deadline = time.monotonic() + 5  # a loaded machine may take a while to end one
    while len(now := children()) > 2 and time.monotonic() < deadline:
        assert p.heartbeat.problem() is None  # the health check reaps what has died since
        time.sleep(0.05)
    assert len(now) == len(workers) and not now & workers  # all replaced, none left behind
    assert answers(p, emitted) in now


def test_cpu_is_bounded_per_call_by_rlimit_cpu(make: Make) -> None:
    """1 to 2 CPU seconds (the limit counts whole seconds), long before the 300 s deadline."""
    p, emitted, observer = make(Hostile(), budget=30.0, limits=SandboxLimits(cpu_s=1))
    assert answers(p, emitted)  # the CPU limit is per call, not per worker's life
    started = time.monotonic()
    d = diagnose(p, emitted, b"/spin")
    assert d.detail == "diagnosis killed: over its CPU budget (1 s)"
    assert time.monotonic() - started < 30.0
    assert observer.overruns == ["diagnosis_cpu"]
    answers(p, emitted)


def test_calls_whose_cpu_adds_up_past_the_limit_are_never_killed(make: Make) -> None:
    """RLIMIT_CPU counts a process's whole life: it is set anew before each call, so a
    long-lived worker's earlier calls never count against the next one."""
    p, emitted, observer = make(Hostile(), budget=30.0, workers=1, limits=SandboxLimits(cpu_s=1))
    for n in range(5):  # 2 CPU seconds in all, on one worker
        d = diagnose(p, emitted, b"/burn-%d" % n)
        assert d.reason is Reason.FOREIGN_ARCHITECTURE, d
    assert observer.overruns == []


def test_a_crashing_worker_is_reported_and_replaced(make: Make) -> None:
    p, emitted, observer = make(Hostile())
    assert diagnose(p, emitted, b"/segv").detail == "diagnosis worker died (SIGSEGV)"
    assert observer.overruns == ["diagnosis_crash"]
    answers(p, emitted)
    assert p.diagnosis_capacity() == 2


def hostile_root(root: Path, names: int, dirs: int) -> Path:
    """The review's input: /app needs `names` missing libraries; ld.so.conf lists `dirs`
    existing directories."""
    directories = [root / "d" / str(j) for j in range(dirs)]
    for d in directories:
        d.mkdir(parents=True)
    needed = [f"libmissing{i}.so" for i in range(names)]
    (root / "etc").mkdir()
    (root / "etc/ld.so.conf").write_text("\n".join(f"/d/{j}" for j in range(dirs)))
    loader = root / GLIBC_LOADER.lstrip("/")
    loader.parent.mkdir(parents=True)
    loader.write_bytes(build_elf(ElfSpec(interpreter=None, soname=loader.name)).data)
    app = root / "app"
    app.write_bytes(build_elf(ElfSpec(elf_type=2, interpreter=GLIBC_LOADER, needed=needed)).data)
    app.chmod(0o755)
    return root


def test_the_reviews_hostile_binary_cannot_grow_the_agent(make: Make, tmp_path: Path) -> None:
    """1,024 missing DT_NEEDED x 4,096 ld.so.conf directories (before: 33.5 s, 758 MiB in
    the agent's own thread). Whatever the linker does with it, the agent does not grow, the
    answer comes within the deadline, and the pool is whole afterwards."""
    root = hostile_root(tmp_path / "root", names=1024, dirs=4096)
    p, emitted, observer = make(Hostile(root), limits=SandboxLimits(memory=64 * MiB))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.monotonic()
    d = diagnose(p, emitted, b"/app")
    assert time.monotonic() - started < 5.0
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss < 16 * 1024  # KiB
    killed = d.reason is Reason.UNDIAGNOSED and d.detail.startswith("diagnosis killed")
    assert killed or (d.reason is Reason.MISSING_LIBRARY and d.library == "libmissing0.so"), d
    assert len(observer.overruns) == killed
    answers(p, emitted)
    assert p.diagnosis_capacity() == 2


PIDS = Path("/sys/fs/cgroup/pids")


@contextmanager
def no_new_tasks() -> Iterator[None]:
    """This process in a pids cgroup (v1) full to its limit: fork and threads fail."""
    cgroup = PIDS / f"execwatch-sandbox-{os.getpid()}"
    cgroup.mkdir()
    try:
        (cgroup / "cgroup.procs").write_text(str(os.getpid()))
        try:
            tasks = len((cgroup / "tasks").read_text().split())
            (cgroup / "pids.max").write_text(str(tasks))
            yield
        finally:
            (PIDS / "cgroup.procs").write_text(str(os.getpid()))
    finally:
        cgroup.rmdir()


def healthz(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_healthz_fails_when_no_worker_is_alive_and_none_can_be_started(make: Make) -> None:
    p, emitted, _ = make(Hostile())
    server = serve(("127.0.0.1", 0), CollectorRegistry(), p.heartbeat.problem)
    port = server.server_port
    try:
        assert healthz(port) == (200, "ok\n")
        with no_new_tasks():
            p.on_record(raw_event(b"/spin-1"))
            p.on_record(raw_event(b"/spin-2"))
            assert p.drain(10.0)
            assert p.diagnosis_capacity() == 0
            status, text = healthz(port)
            assert status == 503
            assert "no diagnosis worker is alive and none could be started" in text
            assert "Resource temporarily unavailable" in text
            # Meanwhile failures are still reported, at once, with why.
            started = time.monotonic()
            d = diagnose(p, emitted, b"/later")
            assert time.monotonic() - started < 1.0
            assert d.reason is Reason.UNDIAGNOSED
            assert d.detail.startswith("not diagnosed: no diagnosis worker is alive")
        deadline = time.monotonic() + 10
        while healthz(port)[0] != 200 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert healthz(port) == (200, "ok\n")  # capacity came back: healthy again
        answers(p, emitted)
    finally:
        server.shutdown()


def running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "R"
    except OSError:
        return False


def test_a_worker_killed_from_outside_is_reported_and_replaced(make: Make) -> None:
    """As the cgroup's OOM killer would: SIGKILL, not sent by the pool."""
    p, emitted, observer = make(Hostile(), budget=1.0)
    p.on_record(raw_event(b"/spin"))
    deadline = time.monotonic() + 5
    while not (spinning := [w for w in children() if running(w)]):
        assert time.monotonic() < deadline, "no worker ever ran the diagnosis"
        time.sleep(0.01)
    os.kill(spinning[0], signal.SIGKILL)
    assert p.drain(5.0)
    assert emitted[-1].diagnosis.detail == "diagnosis killed by SIGKILL (out of memory?)"
    assert observer.overruns == ["diagnosis_memory"]
    answers(p, emitted)
    assert p.diagnosis_capacity() == 2


def test_closing_stops_a_running_diagnosis_and_leaves_no_process(make: Make) -> None:
    p, emitted, observer = make(Hostile(), budget=1.0)
    before = children()
    assert len(before) == 2
    p.on_record(raw_event(b"/spin"))
    started = time.monotonic()
    p.close()
    assert time.monotonic() - started < 6.0  # the drain's 3 s, not the 10 s deadline
    assert [f.diagnosis.detail for f in emitted] == ["not diagnosed: stopping"]
    assert observer.overruns == []
    deadline = time.monotonic() + 2
    while children() & before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not children() & before


def test_workers_that_die_idle_are_replaced_by_the_health_check(make: Make) -> None:
    p, emitted, observer = make(Hostile())
    old = children()
    assert len(old) == 2
    for pid in old:
        os.kill(pid, signal.SIGKILL)
    wait_until(lambda: all(dead(pid) for pid in old), timeout=10)  # SIGKILL is not instant
    assert p.heartbeat.problem() is None
    assert p.diagnosis_capacity() == 2
    assert len(children()) == 2 and not children() & old
    answers(p, emitted)
    assert observer.overruns == []  # no call was running: nothing to count


class Prober:
    """Reports what its worker process may do: its capability sets, and two attempts."""

    def __init__(self, private: Path) -> None:
        self.private = private  # a file in a 0700 directory of another user

    def diagnose(self, event: KernelEvent) -> Diagnosis:
        status = dict(
            line.split(":\t", 1) for line in Path("/proc/self/status").read_text().splitlines()
        )
        sets = {k: int(status[k], 16) for k in ("CapEff", "CapPrm", "CapBnd", "CapInh", "CapAmb")}
        try:
            os.chown(self.private, 1, 1)  # CAP_CHOWN
            chown = "allowed"
        except PermissionError:
            chown = "denied"
        read = self.private.read_bytes().decode()  # CAP_DAC_READ_SEARCH
        detail = f"{sets} {status['NoNewPrivs'].strip()} {chown} {read}"
        return Diagnosis(Reason.FOREIGN_ARCHITECTURE, "amd64", "arm64", detail=detail)


def test_a_worker_keeps_only_the_capabilities_diagnosis_needs(make: Make, tmp_path: Path) -> None:
    """No BPF, PERFMON, CHOWN or anything else the agent holds; no_new_privs; what it
    keeps (SYS_PTRACE, DAC_READ_SEARCH) still works."""
    private = tmp_path / "home"
    private.mkdir(mode=0o700)
    (private / "secret").write_text("kept")
    os.chown(private / "secret", 4242, 4242)
    os.chown(private, 4242, 4242)
    p, emitted, _ = make(Prober(private / "secret"), budget=5.0)

    detail = diagnose(p, emitted, b"/bin/probe").detail

    kept = (1 << 19) | (1 << 2)  # CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH
    wanted = {"CapEff": kept, "CapPrm": kept, "CapBnd": kept, "CapInh": 0, "CapAmb": 0}
    assert detail == f"{wanted} 1 denied kept"
    assert os.stat(private / "secret").st_uid == 4242
