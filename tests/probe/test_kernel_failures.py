"""Real exec failures in this kernel, caught by the real probe and diagnosed.

Each test causes one kind of failure for real and checks what execwatch reports.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from execwatch.binfmt import node_platform
from execwatch.record import ExecFailed, Reason
from tests.probe.conftest import Children, Tracer

NODE_ARCH = node_platform().architecture
FOREIGN_BINARIES = {  # Debian architecture -> OCI architecture
    "arm64": "arm64",
    "armhf": "arm",
    "ppc64el": "ppc64le",
    "s390x": "s390x",
    "riscv64": "riscv64",
    "mips64el": "mips64le",
}


@pytest.mark.parametrize("debian_arch", sorted(FOREIGN_BINARIES))
def test_foreign_binary_is_reported_with_its_architecture(
    tracer: Tracer, foreign_root: Path, tmp_path: Path, debian_arch: str
) -> None:
    binary = tmp_path / f"hello-{debian_arch}"
    shutil.copy(foreign_root / debian_arch / "root/usr/bin/hello", binary)

    with pytest.raises(OSError) as failed:
        subprocess.run([binary], check=False)
    assert failed.value.errno == errno.ENOEXEC

    record = tracer.for_path(binary)
    assert record.diagnosis.reason is Reason.FOREIGN_ARCHITECTURE
    assert record.diagnosis.binary_arch == FOREIGN_BINARIES[debian_arch]
    assert record.diagnosis.node_arch == NODE_ARCH
    assert isinstance(record.event, ExecFailed) and record.event.errno == errno.ENOEXEC
    assert record.event.ppid == os.getpid()
    assert record.event.syscall == "execve"


def test_event_carries_the_callers_identity(tracer: Tracer, foreign_root: Path) -> None:
    binary = foreign_root / "s390x/root/usr/bin/busybox"
    subprocess.run(["sh", "-c", f"exec {binary} true"], check=False, capture_output=True)

    record = tracer.for_path(binary)
    e = record.event
    assert e.comm == "sh"
    assert e.parent_comm.startswith("python") or e.parent_comm == "pytest"
    assert e.ppid == os.getpid()
    assert e.uid == os.getuid()
    assert e.cgroup_id > 0
    assert e.mntns == os.stat("/proc/self/ns/mnt").st_ino
    assert abs(e.time - record.event.time) < 1 and e.time > 1.7e9
    assert record.diagnosis.binary_arch == "s390x"


def test_glibc_binary_without_its_loader(
    tracer: Tracer, children: Children, tmp_path: Path
) -> None:
    """The alpine story: the file exists, its PT_INTERP loader does not -> ENOENT, exit 127."""
    (tmp_path / "app").mkdir()
    shutil.copy("/usr/bin/true", tmp_path / "app/true")

    assert children.exec("/app/true", root=tmp_path) == errno.ENOENT

    record = tracer.for_path("/app/true")
    assert record.diagnosis.reason is Reason.MISSING_INTERPRETER
    assert record.diagnosis.interpreter == "/lib64/ld-linux-x86-64.so.2"


def test_musl_binary_on_a_glibc_root(tracer: Tracer, children: Children, tmp_path: Path) -> None:
    source = tmp_path / "hello.c"
    source.write_text('#include <stdio.h>\nint main(void) { puts("hi"); return 0; }\n')
    (tmp_path / "root/usr/bin").mkdir(parents=True)
    subprocess.run(["musl-gcc", "-o", tmp_path / "root/usr/bin/hello", source], check=True)
    shutil.copytree("/lib64", tmp_path / "root/lib64", symlinks=True)  # glibc's loader only

    assert children.exec("/usr/bin/hello", root=tmp_path / "root") == errno.ENOENT

    record = tracer.for_path("/usr/bin/hello")
    assert record.diagnosis.reason is Reason.MISSING_INTERPRETER
    assert record.diagnosis.interpreter == f"/lib/ld-musl-{os.uname().machine}.so.1"


def test_loader_of_another_architecture_is_a_bad_interpreter(
    tracer: Tracer, children: Children, foreign_root: Path, tmp_path: Path
) -> None:
    loader = "lib64/ld-linux-x86-64.so.2"
    (tmp_path / "lib64").mkdir()
    shutil.copy(foreign_root / "arm64/root/usr/bin/busybox", tmp_path / loader)
    shutil.copy("/usr/bin/true", tmp_path / "true")

    assert children.exec("/true", root=tmp_path) == errno.ELIBBAD

    record = tracer.for_path("/true")
    assert record.diagnosis.reason is Reason.BAD_INTERPRETER
    assert record.diagnosis.interpreter == "/" + loader
    assert record.diagnosis.binary_arch == "arm64"


def test_script_with_missing_interpreter(tracer: Tracer, tmp_path: Path) -> None:
    script = tmp_path / "run.sh"
    script.write_text("#!/opt/nowhere/bash -e\necho hi\n")
    script.chmod(0o755)

    with pytest.raises(FileNotFoundError):
        subprocess.run([script], check=False)

    record = tracer.for_path(script)
    assert record.diagnosis.reason is Reason.MISSING_SHEBANG_INTERPRETER
    assert record.diagnosis.interpreter == "/opt/nowhere/bash"
    assert "CR" not in record.diagnosis.detail


def test_script_with_crlf_line_endings(tracer: Tracer, tmp_path: Path) -> None:
    script = tmp_path / "dos.sh"
    script.write_bytes(b"#!/bin/sh\r\necho hi\r\n")
    script.chmod(0o755)

    with pytest.raises(FileNotFoundError):
        subprocess.run([script], check=False)

    record = tracer.for_path(script)
    assert record.diagnosis.reason is Reason.MISSING_SHEBANG_INTERPRETER
    assert record.diagnosis.interpreter == "/bin/sh\r"
    assert "ends in CR" in record.diagnosis.detail


def test_script_interpreter_of_another_architecture(
    tracer: Tracer, foreign_root: Path, tmp_path: Path
) -> None:
    interpreter = tmp_path / "busybox-ppc"
    shutil.copy(foreign_root / "ppc64el/root/usr/bin/busybox", interpreter)
    script = tmp_path / "tool"
    script.write_text(f"#!{interpreter} sh\necho hi\n")
    script.chmod(0o755)

    with pytest.raises(OSError):
        subprocess.run([script], check=False)

    record = tracer.for_path(script)
    assert record.diagnosis.reason is Reason.FOREIGN_ARCHITECTURE
    assert record.diagnosis.binary_arch == "ppc64le"
    assert record.diagnosis.interpreter == str(interpreter)


def test_script_without_shebang_run_by_execvp_is_benign(tracer: Tracer, tmp_path: Path) -> None:
    script = tmp_path / "plain"
    script.write_text("echo fallback-ran\n")
    script.chmod(0o755)

    out = subprocess.run(["env", script], check=True, capture_output=True, text=True)
    assert out.stdout == "fallback-ran\n"  # glibc's execvp retried it with /bin/sh

    record = tracer.for_path(script)
    assert record.diagnosis.reason is Reason.NO_SHEBANG
    assert record.diagnosis.binary_arch is None


def test_fexecve_goes_through_execveat(
    tracer: Tracer, children: Children, foreign_root: Path, tmp_path: Path
) -> None:
    binary = tmp_path / "riscv-tool"
    shutil.copy(foreign_root / "riscv64/root/usr/bin/busybox", binary)

    assert children.exec(str(binary), via_fd=True) == errno.ENOEXEC

    record = tracer.wait_for(
        lambda r: r.event.syscall == "execveat" and r.event.path == binary.name
    )
    assert isinstance(record.event, ExecFailed) and record.event.via_fd
    assert record.diagnosis.reason is Reason.FOREIGN_ARCHITECTURE
    assert record.diagnosis.binary_arch == "riscv64"


def test_truncated_elf_of_this_architecture_is_corrupt(tracer: Tracer, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.write_bytes(Path("/usr/bin/true").read_bytes()[:100])
    broken.chmod(0o755)

    with pytest.raises(OSError) as failed:
        subprocess.run([broken], check=False)
    assert failed.value.errno == errno.ENOEXEC

    record = tracer.for_path(broken)
    assert record.diagnosis.reason is Reason.CORRUPT_BINARY


def test_missing_execute_permission(tracer: Tracer, children: Children, tmp_path: Path) -> None:
    target = tmp_path / "noexec"
    shutil.copy("/usr/bin/true", target)
    target.chmod(0o644)

    assert children.exec(str(target)) == errno.EACCES

    record = tracer.for_path(target)
    assert record.diagnosis.reason is Reason.PERMISSION_DENIED
    assert "no execute permission" in record.diagnosis.detail


def test_path_search_misses_are_classified_as_not_found(tracer: Tracer) -> None:
    subprocess.run(["env", "no-such-command-execwatch"], check=False, capture_output=True)

    record = tracer.wait_for(lambda r: r.event.path.endswith("/no-such-command-execwatch"))
    assert record.diagnosis.reason is Reason.NOT_FOUND


def test_hostile_file_names_are_read_exactly(
    tracer: Tracer, foreign_root: Path, tmp_path: Path
) -> None:
    name = os.fsdecode(b"evil\nname\xff\x1b[31m")
    binary = tmp_path / name
    shutil.copy(foreign_root / "arm64/root/usr/bin/busybox", binary)

    with pytest.raises(OSError):
        subprocess.run([binary], check=False)

    record = tracer.for_path(binary)
    assert record.diagnosis.reason is Reason.FOREIGN_ARCHITECTURE
    assert os.fsencode(record.event.path).endswith(b"evil\nname\xff\x1b[31m")


def test_successful_execs_are_not_reported(tracer: Tracer) -> None:
    subprocess.run(["/bin/true"], check=True)
    subprocess.run(
        ["sh", "-c", "exec /nonexistent-marker-execwatch"], check=False, capture_output=True
    )

    tracer.for_path("/nonexistent-marker-execwatch")
    assert not [r for r in tracer.records if r.event.path == "/bin/true"]


def test_a_gone_chrooted_caller_is_diagnosed_in_its_own_root_not_its_parents(
    tracer: Tracer, tmp_path: Path
) -> None:
    """chroot(1) execs and dies at once; its parent's root is another filesystem, where
    /usr/local/bin/runner does not exist. The root the kernel recorded is used instead."""
    (tmp_path / "usr/local/bin").mkdir(parents=True)
    shutil.copy("/usr/bin/true", tmp_path / "usr/local/bin/runner")

    rc = subprocess.run(["chroot", tmp_path, "/usr/local/bin/runner"], check=False).returncode

    assert rc == 127
    record = tracer.for_path("/usr/local/bin/runner")
    assert record.event.root_ino == os.stat(tmp_path).st_ino
    assert record.diagnosis.reason is Reason.MISSING_INTERPRETER
