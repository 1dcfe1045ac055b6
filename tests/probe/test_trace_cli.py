"""`execwatch trace` as an operator runs it: output, metrics, signals and clear errors."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from execwatch.probe import ProbeError, loader
from tests.support.probe.debian_roots import newer_package

EXECWATCH = [sys.executable, "-m", "execwatch.cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def loaded_programs() -> set[int]:
    out = subprocess.run(["bpftool", "prog", "show", "-j"], check=True, capture_output=True)
    return {p["id"] for p in json.loads(out.stdout)}


def programs_held_by(pid: int) -> set[int]:
    """BPF program ids behind the process's fds (other tests may load probes meanwhile)."""
    ids = set()
    for info in Path(f"/proc/{pid}/fdinfo").iterdir():
        for line in info.read_text().splitlines():
            if line.startswith("prog_id:"):
                ids.add(int(line.split()[1]))
    return ids


class TraceProcess:
    stderr = ""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [*EXECWATCH, "trace", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        deadline = time.monotonic() + 20
        assert self.proc.stderr is not None
        while time.monotonic() < deadline:  # the log line says the probe is attached
            line = self.proc.stderr.readline()
            if "tracing failed execs" in line:
                return
            if not line and self.proc.poll() is not None:
                break
        raise AssertionError(f"trace did not start: {self.proc.stderr.read()}")

    def stop(self, sig: int = signal.SIGTERM) -> tuple[int, str]:
        """The exit code and standard output; standard error is kept in `stderr`."""
        self.proc.send_signal(sig)
        out, self.stderr = self.proc.communicate(timeout=20)
        return self.proc.returncode, out


@pytest.fixture
def arm64_binary(foreign_root: Path, tmp_path: Path) -> Path:
    binary = tmp_path / "server-arm64"
    shutil.copy(foreign_root / "arm64/root/usr/bin/hello", binary)
    return binary


def fail_n_times(binary: Path, n: int) -> None:
    for _ in range(n):
        with pytest.raises(OSError):
            subprocess.run([binary], check=False)


def test_json_lines_carry_the_documented_fields(
    arm64_binary: Path, start_trace: Callable[..., TraceProcess]
) -> None:
    trace = start_trace("--json", "--window", "0.2")
    fail_n_times(arm64_binary, 5)
    time.sleep(0.6)
    code, out = trace.stop()

    assert code == 0
    records = [json.loads(line) for line in out.splitlines()]
    ours = [r for r in records if r["path"] == str(arm64_binary)]
    assert sum(r["count"] for r in ours) == 5  # first one at once, the repeats folded
    first = ours[0]
    required = {"time", "errno", "reason", "path", "binary_arch", "node_arch", "interpreter",
                "pid", "ppid", "comm", "parent_comm", "uid", "cgroup_id", "mntns"}  # fmt: skip
    assert required <= first.keys()
    assert (first["errno"], first["reason"], first["binary_arch"]) == (
        "ENOEXEC",
        "ForeignArchitecture",
        "arm64",
    )
    assert first["ppid"] == os.getpid()


def test_a_user_retrying_seconds_apart_gets_every_failure_diagnosed(
    arm64_binary: Path, tmp_path: Path, start_trace: Callable[..., TraceProcess]
) -> None:
    """A broken binary run again 1.5 s later, four copies; a program needing GLIBC_2.38,
    twice, 2.5 s apart: six diagnosed lines, and the summary on stopping."""
    arms = [tmp_path / f"arm-{n}" for n in range(1, 5)]
    hellos = [tmp_path / f"hello-{n}" for n in range(1, 3)]
    for arm in arms:
        shutil.copy(arm64_binary, arm)
    for hello in hellos:
        shutil.copy(newer_package("hello") / "usr/bin/hello", hello)
    trace = start_trace("--json")
    for arm in arms:
        fail_n_times(arm, 1)
        time.sleep(1.5)
    for hello in hellos:
        subprocess.run([hello], capture_output=True, check=False)
        time.sleep(2.5)
    code, out = trace.stop(signal.SIGINT)

    assert code == 0
    reasons = {r["path"]: (r["reason"], r["cause"]) for r in map(json.loads, out.splitlines())}
    assert {str(b): reasons.get(str(b)) for b in arms + hellos} == {
        **{str(arm): ("ForeignArchitecture", None) for arm in arms},
        **{str(hello): ("MissingSymbolVersion", None) for hello in hellos},
    }
    summary = trace.stderr.strip().splitlines()[-1]
    assert re.fullmatch(r"execwatch: \d+ failures seen, \d+ undiagnosed( \(.*\))?", summary)


def test_human_output_is_one_escaped_line_per_record(
    foreign_root: Path, tmp_path: Path, start_trace: Callable[..., TraceProcess]
) -> None:
    binary = tmp_path / "bad\nname\x1b"
    shutil.copy(foreign_root / "s390x/root/usr/bin/busybox", binary)
    trace = start_trace()
    fail_n_times(binary, 1)
    time.sleep(0.3)
    code, out = trace.stop(signal.SIGINT)

    assert code == 0
    lines = [line for line in out.splitlines() if "bad\\x0aname\\x1b" in line]
    assert len(lines) == 1
    assert "ForeignArchitecture" in lines[0] and "(s390x on " in lines[0]
    assert "\x1b" not in out


def test_metrics_report_exact_kernel_counts_and_diagnoses(
    arm64_binary: Path, start_trace: Callable[..., TraceProcess]
) -> None:
    port = free_port()
    trace = start_trace("--metrics-address", f"127.0.0.1:{port}")
    fail_n_times(arm64_binary, 3)
    time.sleep(0.3)
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    trace.stop()

    samples = {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in body.splitlines()
        if line.startswith("execwatch_")
    }
    assert samples['execwatch_kernel_exec_failures_total{errno="ENOEXEC"}'] >= 3
    assert samples['execwatch_events_total{errno="ENOEXEC",reason="ForeignArchitecture"}'] >= 3
    assert samples['execwatch_kernel_dropped_total{type="ringbuf_full"}'] == 0


def test_signals_detach_every_program(start_trace: Callable[..., TraceProcess]) -> None:
    trace = start_trace()
    ours = programs_held_by(trace.proc.pid)
    # 2 exec exits, exit_group, signal, 2 binfmt_misc mount exits (mount, fsopen), and
    # emulated_exec: loaded, attached only with emulators
    assert len(ours) == 7 and ours <= loaded_programs()

    code, _ = trace.stop(signal.SIGTERM)

    assert code == 0
    deadline = time.monotonic() + 5  # the kernel frees programs after an RCU grace period
    while ours & loaded_programs() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not ours & loaded_programs()


NO_CAPS = "execwatch: execwatch needs CAP_BPF and CAP_PERFMON (root, or a user holding them) to load its probe"  # noqa: E501


def test_not_root_is_a_one_line_error() -> None:
    out = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *EXECWATCH, "trace"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [NO_CAPS]


def test_root_without_capabilities_is_a_one_line_error() -> None:
    """uid 0 is not what loads BPF: the capabilities are."""
    out = subprocess.run(
        ["setpriv", "--bounding-set=-all", "--inh-caps=-all", "--", *EXECWATCH, "trace"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [NO_CAPS]


def test_bad_metrics_address_is_a_one_line_error() -> None:
    out = subprocess.run(
        [*EXECWATCH, "trace", "--metrics-address", "nope"], capture_output=True, text=True
    )
    assert out.returncode == 2
    assert out.stderr.strip() == (
        "execwatch trace: error: argument --metrics-address: wants HOST:PORT with a port in"
        " 0..65535, got 'nope' (see execwatch trace --help)"
    )


def test_an_address_it_cannot_bind_is_a_one_line_error() -> None:
    out = subprocess.run(
        [*EXECWATCH, "trace", "--no-attribution", "--metrics-address", "192.0.2.1:9100"],
        capture_output=True,
        text=True,
    )  # 192.0.2.1 (TEST-NET-1) is no address of this host
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1] == (
        "execwatch: --metrics-address 192.0.2.1:9100: Cannot assign requested address"
    )


def test_missing_btf_is_explained(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(loader, "VMLINUX_BTF", tmp_path / "no-btf")
    with pytest.raises(ProbeError, match="exposes no BTF"):
        loader.check_host()


def test_missing_libbpf_is_explained(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loader, "LIBBPF_NAME", "libbpf-does-not-exist.so.9")
    with pytest.raises(ProbeError, match="libbpf not found"):
        loader.Probe()


def test_missing_bpf_object_says_how_to_build_it(tmp_path: Path) -> None:
    with pytest.raises(ProbeError, match="make bpf"):
        loader.Probe(loader.ProbeOptions(object_path=tmp_path / "none.bpf.o")).open()


@pytest.fixture
def start_trace() -> Iterator[Callable[..., TraceProcess]]:
    """Starts `execwatch trace`; afterwards checks that each one has exited."""
    started: list[TraceProcess] = []

    def start(*args: str) -> TraceProcess:
        started.append(TraceProcess(*args))
        return started[-1]

    yield start
    running = [t.proc for t in started if t.proc.poll() is None]
    for proc in running:
        proc.kill()
        proc.wait()
    assert not running, "a trace process was left running"


def test_a_closed_pipe_ends_trace_quietly(arm64_binary: Path) -> None:
    trace = subprocess.Popen(
        f"{' '.join(EXECWATCH)} trace --no-attribution | head -1",
        shell=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 20
    while trace.poll() is None and time.monotonic() < deadline:  # until it attached and quit
        fail_n_times(arm64_binary, 1)
        time.sleep(0.2)
    out, err = trace.communicate(timeout=20)
    assert trace.returncode == 0
    assert len(out.splitlines()) == 1
    assert "Traceback" not in err and "Broken pipe" not in err
