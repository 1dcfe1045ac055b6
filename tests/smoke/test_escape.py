"""The sandbox against what untrusted code tries: each attempt is contained, reported as the
run's finding, and leaves the host as it was; unprivileged (setpriv to nobody) and as root."""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.smoke.conftest import NOBODY, execwatch_scan, runs
from tests.support.binfmt.cbuild import compile_c
from tests.support.images.imagebuild import Entry, Image, file, oci_layout, symlink

AS = {"root": None, "nobody": NOBODY}
BUSYBOX = Path("/usr/bin/busybox")  # Debian's busybox-static
CONNECT_C = """#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
int main(int argc, char **argv) {
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
  inet_pton(AF_INET, argv[1], &a.sin_addr);
  int s = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(s, (struct sockaddr *)&a, sizeof a) == 0) return 42;
  perror("connect");
  return 0;
}
"""
EUID_C = "#include <unistd.h>\nint main(void) { return geteuid() == 0 ? 42 : 0; }\n"


def busybox_layer() -> list[Entry]:
    applets = ("sh", "dd", "wget", "cat", "sleep", "ls", "id", "nc")
    return [
        file("bin/busybox", BUSYBOX.read_bytes()),
        *(symlink(f"bin/{a}", "busybox") for a in applets),
    ]


def run_sh(
    shared: Path, script: str, who: str, *extra: str, image: Image | None = None
) -> tuple[int, dict[str, Any], float]:
    image = image or Image([busybox_layer()], entrypoint=["/bin/sh", "-c"])
    layout = oci_layout(shared / "img", [image])
    started = time.monotonic()
    args = ("--run-args", shlex.quote(script)) if script else ()
    env = {"TMPDIR": str(scratch(shared))}
    code, doc, err = execwatch_scan(str(layout), "--run", *args, *extra, user=AS[who], env=env)
    assert code in (0, 1), err
    [run] = runs(doc)
    return code, run, time.monotonic() - started


def scratch(shared: Path) -> Path:
    """The test's own TMPDIR for the scan, writable by nobody too: what the run leaves
    there is this test's alone, whatever else runs on the machine."""
    tmp = shared / "tmp"
    tmp.mkdir(exist_ok=True)
    tmp.chmod(0o1777)
    return tmp


@pytest.fixture(autouse=True)
def host_unchanged(shared_dir: Path) -> Iterator[None]:
    """No unpacked root left behind, no process of the sandbox's uid left running."""
    yield
    assert sorted(os.listdir(scratch(shared_dir))) == []
    stray = subprocess.run(
        ["pgrep", "-u", "65534", "-f", "busybox|sleep"], capture_output=True, text=True
    )
    assert stray.stdout == ""


@pytest.mark.parametrize("who", AS)
def test_a_fork_bomb_meets_the_process_limit_and_the_deadline(shared_dir: Path, who: str) -> None:
    code, run, took = run_sh(shared_dir, "while :; do sleep 100 & done", who, "--run-timeout", "3")
    assert (code, run["check"]) == (0, "run-started")
    assert "can't fork: Resource temporarily unavailable" in run["message"]  # RLIMIT_NPROC
    assert took < 20


@pytest.mark.parametrize("who", AS)
def test_a_10_gb_write_stops_at_the_writable_layer_cap(shared_dir: Path, who: str) -> None:
    free = shutil.disk_usage("/tmp").free
    script = "dd if=/dev/zero of=/big bs=1M count=10240"
    _, run, _ = run_sh(shared_dir, script, who)
    assert run["check"] == "run-started"
    assert "exit 1; stderr: 256+0 records out" in run["message"]  # capped at 256 MiB
    assert shutil.disk_usage("/tmp").free > free - (512 << 20)


@pytest.mark.parametrize("who", AS)
def test_a_connect_to_a_host_address_is_unreachable(
    shared_dir: Path, tmp_path: Path, who: str
) -> None:
    addresses = subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split()
    host = next(a for a in addresses if "." in a and not a.startswith("127."))
    with socket.create_server((host, 0)) as listener:
        listener.settimeout(0.5)
        port = listener.getsockname()[1]
        program = compile_c(tmp_path / "connect", CONNECT_C, "musl-gcc", "-static")
        image = Image(
            [[file("connect", program.read_bytes())]],
            entrypoint=["/connect"],
            cmd=[host, str(port)],
        )
        _, run, _ = run_sh(shared_dir, "", who, image=image)
        with pytest.raises(TimeoutError):
            listener.accept()
    assert "started: exit 0" in run["message"]
    assert "connect: Network unreachable" in run["message"]


@pytest.mark.parametrize("who", AS)
def test_host_files_and_proc_1_root_show_only_the_image(shared_dir: Path, who: str) -> None:
    secret = shared_dir / "secret"
    secret.write_text("HOST-SECRET\n")
    secret.chmod(0o644)
    script = (
        f"cat {secret} /proc/1/root{secret} /proc/*/root{secret} 2>/dev/null | grep -q HOST-SECRET"
        " && exit 42; ls /proc | grep -qx 2 && exit 43; exit 0"
    )
    _, run, _ = run_sh(shared_dir, script, who)
    assert run["message"].startswith("run: started: exit 0"), run["message"]


@pytest.mark.parametrize("who", AS)
def test_sleep_infinity_is_killed_at_the_deadline(shared_dir: Path, who: str) -> None:
    code, run, took = run_sh(shared_dir, "sleep infinity", who, "--run-timeout", "2")
    assert (code, run["check"]) == (0, "run-started") and "deadline" in run["message"]
    code, run, took = run_sh(
        shared_dir, "sleep infinity", who, "--run-timeout", "2", "--run-timeout-fails"
    )
    assert (code, run["severity"]) == (1, "error") and "deadline" in run["message"]
    assert took < 20


@pytest.mark.parametrize("who", AS)
def test_a_setuid_root_binary_gains_nothing(shared_dir: Path, tmp_path: Path, who: str) -> None:
    euid = compile_c(tmp_path / "euid", EUID_C, "musl-gcc", "-static")
    layer = [*busybox_layer(), file("bin/euid", euid.read_bytes(), 0o4755)]
    _, run, _ = run_sh(
        shared_dir, "", who, image=Image([layer], entrypoint=["/bin/euid"], user="1000")
    )
    assert run["message"].startswith("run: started: exit 0"), run["message"]  # euid stays 1000
