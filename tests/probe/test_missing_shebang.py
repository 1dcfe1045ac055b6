"""A file with neither ELF header nor `#!`, refused with ENOEXEC: fatal or benign by what
its caller does next, told apart by the real probe in this kernel.

A caller that gives up, exiting at once with no exec since (what runc's init does:
`exec /app/run.sh: exec format error`), makes it MissingShebang; a shell that runs the file
itself (bash), or retries it with /bin/sh (dash, busybox, glibc's execvp()), leaves it the
benign NoShebang. Every caller here is a real process: bash, dash, env, and children of
this test that exec the file once and then exit, exec something else or die of a signal.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from execwatch.record import ExecFailure, Reason
from execwatch.text import safe_text
from tests.probe.conftest import Tracer
from tests.probe.test_trace_cli import TraceProcess, start_trace

__all__ = ["start_trace"]
NO_SHEBANG = b"echo hello\n"


def script(directory: Path, content: bytes = NO_SHEBANG, name: str = "noshebang") -> Path:
    path = directory / name
    path.write_bytes(content)
    path.chmod(0o755)
    return path


def exec_once(path: str, cwd: Path, then: str = "exit 1") -> int:
    """A child that execs `path` once and, refused, does `then`: "exit N" (as a runtime's
    init gives up), "exec" (runs /bin/true instead) or "SIGSEGV" (dies of it). Its pid."""
    pid = os.fork()
    if pid == 0:  # the child: nothing but syscalls until it is gone
        try:
            os.chdir(cwd)
            os.execv(path, [path])
        except OSError:
            pass
        if then == "exec":
            os.execv("/bin/true", ["true"])
        if then == "SIGSEGV":
            signal.signal(signal.SIGSEGV, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGSEGV)
        os._exit(int(then.removeprefix("exit ")))
    os.waitpid(pid, 0)
    return pid


def of_pid(tracer: Tracer, pid: int, timeout: float = 10.0) -> ExecFailure:
    return tracer.wait_for(lambda r: r.event.tgid == pid, timeout)


def test_trace_tells_bash_running_the_file_from_a_caller_that_exits(
    start_trace: Callable[..., TraceProcess], tmp_path: Path
) -> None:
    """The benign one is quiet (counted, not printed, unless --show-no-shebang)."""
    script(tmp_path)
    trace = start_trace("--json", "--no-attribution")

    bash = subprocess.run(
        ["bash", "-c", "./noshebang"], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert bash.stdout == "hello\n"  # bash read the file and ran it itself
    gave_up = exec_once("./noshebang", tmp_path)
    time.sleep(1.0)  # both callers' exits are in the kernel's records by now
    code, out = trace.stop()

    assert code == 0
    records = [json.loads(line) for line in out.splitlines()]
    mine = [r for r in records if r["path"] == "./noshebang"]
    assert [r["pid"] for r in mine] == [gave_up]  # bash's failure: benign, not printed
    (fatal,) = mine
    assert (fatal["reason"], fatal["errno"]) == ("MissingShebang", "ENOEXEC")
    assert fatal["detail"].startswith(
        'neither ELF nor #!: no #! interpreter line (first bytes: "echo hello\\x0a"); '
    )
    assert "exited with status 1" in fatal["detail"]
    assert "nothing retried it with a shell" in fatal["detail"]


def test_bash_running_the_file_itself_is_no_shebang(tracer: Tracer, tmp_path: Path) -> None:
    script(tmp_path)

    bash = subprocess.run(
        ["bash", "-c", "./noshebang"], cwd=tmp_path, capture_output=True, text=True, check=True
    )

    assert bash.stdout == "hello\n"
    record = tracer.wait_for(lambda r: r.event.path == "./noshebang" and r.event.comm == "bash")
    assert record.diagnosis.reason is Reason.NO_SHEBANG
    assert "ran it itself (as bash does) and exited with status 0" in record.diagnosis.detail
    assert "retr" not in record.diagnosis.detail  # nothing retried it: bash read it


@pytest.mark.parametrize(
    ("content", "shown", "cause"),
    [
        (
            b"\xef\xbb\xbf#!/bin/sh\necho hi\n",
            '"\\xef\\xbb\\xbf#!/bin/sh\\x0aecho hi\\x0a"',
            "a UTF-8 byte order mark (EF BB BF) before #!",
        ),
        (b"\n#!/bin/sh\necho hi\n", '"\\x0a#!/bin/sh\\x0aecho hi\\x0a"', "a blank first line"),
        (
            b"echo hi\r\nexit 0\r\n",
            '"echo hi\\x0d\\x0aexit 0\\x0d\\x0a"',
            "CRLF (Windows) line endings",
        ),
    ],
    ids=["bom", "blank-first-line", "crlf"],
)
def test_a_lost_shebang_is_missing_shebang_with_its_cause(
    tracer: Tracer, tmp_path: Path, content: bytes, shown: str, cause: str
) -> None:
    script(tmp_path, content)

    pid = exec_once(str(tmp_path / "noshebang"), tmp_path, "exit 255")  # runc 1.2's init

    record = of_pid(tracer, pid)
    assert record.diagnosis.reason is Reason.MISSING_SHEBANG
    assert record.diagnosis.binary_arch is None
    detail = safe_text(record.diagnosis.detail)
    assert cause in detail
    assert f"(first bytes: {shown})" in detail
    assert "exited with status 255" in detail


def test_a_caller_killed_by_a_signal_after_the_failure_is_missing_shebang(
    tracer: Tracer, tmp_path: Path
) -> None:
    script(tmp_path)

    pid = exec_once(str(tmp_path / "noshebang"), tmp_path, "SIGSEGV")

    record = of_pid(tracer, pid)
    assert record.diagnosis.reason is Reason.MISSING_SHEBANG
    assert "was killed by SIGSEGV" in record.diagnosis.detail


def test_a_caller_that_runs_another_program_next_went_on(tracer: Tracer, tmp_path: Path) -> None:
    script(tmp_path)

    pid = exec_once(str(tmp_path / "noshebang"), tmp_path, "exec")

    record = of_pid(tracer, pid)
    assert record.diagnosis.reason is Reason.NO_SHEBANG
    assert "its caller ran another program next" in record.diagnosis.detail


@pytest.mark.parametrize("shell", ["dash", "env"])
def test_a_shell_or_execvp_retrying_with_bin_sh_is_no_shebang(
    tracer: Tracer, tmp_path: Path, shell: str
) -> None:
    script(tmp_path)
    argv = [shell, "-c", "./noshebang"] if shell == "dash" else ["env", "./noshebang"]

    ran = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, check=True)

    assert ran.stdout == "hello\n"
    record = tracer.wait_for(lambda r: r.event.path == "./noshebang" and r.event.comm == shell)
    assert record.diagnosis.reason is Reason.NO_SHEBANG
    assert "ran another program next" in record.diagnosis.detail


def test_a_caller_that_keeps_running_is_no_shebang_once_the_window_ends(
    tracer: Tracer, tmp_path: Path
) -> None:
    script(tmp_path)
    child = subprocess.Popen(
        [
            "python3",
            "-c",
            "import os, time\ntry: os.execv('./noshebang', ['x'])\nexcept OSError: time.sleep(5)",
        ],
        cwd=tmp_path,
    )
    try:
        started = time.monotonic()
        record = tracer.wait_for(
            lambda r: r.event.path == "./noshebang" and r.event.tgid == child.pid, timeout=10
        )
        waited = time.monotonic() - started
    finally:
        child.kill()
        child.wait()

    assert record.diagnosis.reason is Reason.NO_SHEBANG
    assert "its caller went on: it kept running for 2 s" in record.diagnosis.detail
    assert waited >= 2.0  # held for the whole death window
