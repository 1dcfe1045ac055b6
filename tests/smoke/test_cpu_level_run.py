"""`execwatch scan IMAGE --run --cpu-level x86-64-vN`: the amd64 entrypoint runs in a
system-mode QEMU microVM whose CPU model is that level, booted on the oldest kernel of the
matrix (bullseye's), so an instruction the fleet's oldest nodes lack is a real SIGILL.

Each run boots a VM under TCG (seconds each): the programs are built once per module."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from execwatch.scan.errors import ScanInputError
from execwatch.smoke.microvm import Guest, Vm, parse_report, write_initramfs
from tests.smoke.conftest import NOBODY, execwatch_scan, runs
from tests.support.binfmt.cbuild import AVX2_FIRST_C, HELLO_C, compile_c
from tests.support.images.base_images import glibc_base, host_glibc
from tests.support.images.imagebuild import Image, file, oci_layout, symlink, tree, usrmerge
from tests.support.kernels.vm import Kernel
from tests.support.smoke.smoke_cases import ARM64_ROOT, EMULATORS

# Writes reports of its own on the report port without end, from a child that outlives it
# (with the orders' nonce if it could read them), says on stderr what it managed, then
# executes AVX2.
FORGER_C = r"""
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
int main(void) {
  char nonce[33] = "0123456789abcdef0123456789abcdef", line[512], cwd[256] = "?";
  int fd = open("/.execwatch-run", O_RDONLY), orders = fd >= 0, port;
  if (orders) { read(fd, nonce, 32); close(fd); }
  snprintf(line, sizeof line, "\nEXECWATCH-REPORT-1 %s program=2f666f726765 exec_errno=-"
           " status=0 timed_out=0 stdout=- stderr=- END %s\n", nonce, nonce);
  port = open("/dev/ttyS1", O_WRONLY | O_NOCTTY);
  if (port >= 0 && fork() == 0)
    for (;;) write(port, line, strlen(line));  /* and goes on, after the program's end */
  fputs(line, stdout);
  getcwd(cwd, sizeof cwd);
  fprintf(stderr, "%sforged=%s orders=%s cwd=%s GREETING=%s\n", line,
          port >= 0 ? "yes" : "no", orders ? "read" : "gone", cwd, getenv("GREETING"));
  fflush(NULL);
  __asm__ volatile("vpxor %%ymm0, %%ymm0, %%ymm0" ::: "xmm0");
  return 0;
}
"""
SERVER_C = (
    "#include <stdio.h>\n#include <unistd.h>\n"
    'int main(void) { fprintf(stderr, "uid=%d gid=%d\\n", getuid(), getgid());'
    " for (;;) pause(); }\n"
)


@pytest.fixture(scope="module")
def kernel() -> Iterator[str]:
    """bullseye's kernel, copied where every user can read it (the cache may be under
    root's home)."""
    d = Path(tempfile.mkdtemp(prefix="execwatch-vm-kernel-"))
    d.chmod(0o755)
    copy = Path(shutil.copy(Kernel.fetched("bullseye").vmlinuz, d / "vmlinuz"))
    copy.chmod(0o644)
    yield str(copy)
    shutil.rmtree(d)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("cpu-level-bin")
    v3 = ["-march=x86-64-v3", "-Wl,-z,x86-64-v3", "-O2"]
    return {
        "avx2-unmarked": compile_c(d / "avx2", AVX2_FIRST_C, "musl-gcc", "-static", "-O2"),
        "glibc-marked": compile_c(d / "needs-v3", HELLO_C, "gcc", *v3),
        "musl-marked": compile_c(d / "v3", HELLO_C, "musl-gcc", "-static", "-Wl,-z,x86-64-v3"),
        "forger": compile_c(d / "forger", FORGER_C, "musl-gcc", "-static", "-O2"),
        "server": compile_c(d / "server", SERVER_C, "musl-gcc", "-static"),
    }


def layout_of(
    shared_dir: Path, program: Path, workdir: str = "", env: list[str] | None = None
) -> Path:
    layer = [file("app", program.read_bytes())]
    image = Image([layer], entrypoint=["/app"], workdir=workdir, env=env or [])
    return oci_layout(shared_dir / "img", [image])


def static_errors(doc: dict[str, object]) -> set[str]:
    findings = doc["findings"]
    assert isinstance(findings, list)
    return {f["check"] for f in findings if f["source"] == "static" and f["severity"] == "error"}


@pytest.mark.parametrize("who", ["root", "nobody"])
def test_unmarked_avx2_dies_of_sigill_on_a_v2_cpu(
    built: dict[str, Path], shared_dir: Path, kernel: str, who: str
) -> None:
    """Nothing marks the program, so the static side sees no fault; the v2 CPU does, for a
    root caller (QEMU then runs as nobody) and an unprivileged one alike. `--cpu` is
    argparse's prefix of `--cpu-level`: the same one knob."""
    layout = layout_of(shared_dir, built["avx2-unmarked"])
    code, doc, err = execwatch_scan(str(layout), "--run", "--cpu", "x86-64-v2",
                                    "--vm-kernel", kernel,
                                    user=NOBODY if who == "nobody" else None)  # fmt: skip
    assert code == 1, err
    assert static_errors(doc) == set()
    [run] = runs(doc)
    assert (run["check"], run["severity"], run["path"]) == ("cpu-level", "error", "/app")
    assert run["message"].startswith("run under QEMU system (Nehalem): killed by SIGILL")
    assert "static side says it runs, but the run failed (UnsupportedCPU)" in run["disagreement"]


def test_unmarked_avx2_starts_on_a_v3_cpu(
    built: dict[str, Path], shared_dir: Path, kernel: str
) -> None:
    """The entrypoint is a bare name, found on the image's PATH as runc finds it, through
    a symlink: the initramfs keeps the image's links."""
    layer = [file("opt/avx2/bin/avx2", built["avx2-unmarked"].read_bytes()),
             symlink("opt/bin/app", "../avx2/bin/avx2")]  # fmt: skip
    image = Image([layer], entrypoint=["app"], env=["PATH=/usr/bin:/opt/bin"])
    layout = oci_layout(shared_dir / "img", [image])
    code, doc, err = execwatch_scan(str(layout), "--run", "--cpu-level", "x86-64-v3",
                                    "--vm-kernel", kernel)  # fmt: skip
    assert code == 0, err
    [run] = runs(doc)
    assert (run["check"], run["path"]) == ("run-started", "/opt/bin/app")
    assert run["message"].startswith("run under QEMU system (Haswell): started: exit 0")


def test_a_marked_glibc_program_is_refused_by_its_loader_static_and_run(
    built: dict[str, Path], shared_dir: Path, kernel: str
) -> None:
    layer = [*glibc_base(host_glibc()), file("app", built["glibc-marked"].read_bytes())]
    layout = oci_layout(shared_dir / "img", [Image([layer], entrypoint=["/app"])])
    code, doc, err = execwatch_scan(str(layout), "--run", "--cpu-level", "x86-64-v2",
                                    "--vm-kernel", kernel)  # fmt: skip
    assert code == 1, err
    assert static_errors(doc) == {"cpu-level"}
    [run] = runs(doc)
    assert (run["check"], run["severity"]) == ("cpu-level", "error")
    assert "exit 127: the loader says: CPU ISA level is lower than required" in run["message"]
    assert "disagreement" not in run


def test_the_guest_cannot_forge_the_report(
    built: dict[str, Path], shared_dir: Path, kernel: str
) -> None:
    """The program writes "started" reports on the report port, from a child that outlives
    it, and on its output; it cannot read the orders (nor their nonce), and the run is what
    the CPU did: SIGILL. It ran with the image's WorkingDir and Env."""
    layout = layout_of(shared_dir, built["forger"], workdir="/srv", env=["GREETING=hi"])
    code, doc, err = execwatch_scan(str(layout), "--run", "--cpu-level", "x86-64-v2",
                                    "--vm-kernel", kernel)  # fmt: skip
    assert code == 1, err
    [run] = runs(doc)
    assert run["check"] == "cpu-level" and "killed by SIGILL" in run["message"], run
    assert "forged=yes orders=gone cwd=/srv GREETING=hi" in run["message"]


def test_a_report_needs_the_runs_nonce_at_both_ends() -> None:
    nonce, other = "ab" * 16, "cd" * 16
    line = "EXECWATCH-REPORT-1 {} program=2f61 exec_errno=- status=0 timed_out=0 stdout=-"
    line += " stderr=- END {}"
    assert parse_report(line.format(nonce, nonce).encode(), nonce) is not None
    for forged in (line.format(other, other), line.format(nonce, other), line.format(other, nonce)):
        assert parse_report(forged.encode(), nonce) is None
    assert parse_report(line.format(nonce, nonce).encode() + b" trailing", nonce) is None


def test_a_server_that_never_exits_counts_as_started(
    built: dict[str, Path], shared_dir: Path, kernel: str
) -> None:
    """It runs as the image's User (1000), on an x86-64-v1 CPU, until the deadline."""
    image = Image([[file("app", built["server"].read_bytes())]], entrypoint=["/app"], user="1000")
    layout = oci_layout(shared_dir / "img", [image])
    code, doc, err = execwatch_scan(str(layout), "--run", "--cpu-level", "x86-64-v1",
                                    "--vm-kernel", kernel, "--run-timeout", "2")  # fmt: skip
    assert code == 0, err
    [run] = runs(doc)
    assert run["check"] == "run-started"
    assert run["message"].startswith("run under QEMU system (Opteron_G1): still running")
    assert "; stderr: uid=1000 gid=1000 (" in run["message"]


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--cpu-level", "x86-64-v4"], "x86-64-v4: QEMU's TCG (7.2) has no AVX-512"),
        (
            ["--cpu-level", "x86-64-v2", "--vm-kernel", "/nonexistent/vmlinuz"],
            "no readable kernel /nonexistent/vmlinuz for the microVM (give --vm-kernel PATH)",
        ),
        (
            ["--cpu-level", "x86-64-v2", "--qemu-dir", "/nonexistent"],
            "no qemu-system-x86_64 in /nonexistent or on PATH (--qemu-dir)",
        ),
    ],
)
def test_a_microvm_that_cannot_be_made_is_one_line_and_exit_2(
    built: dict[str, Path], shared_dir: Path, kernel: str, extra: list[str], words: str
) -> None:
    layout = layout_of(shared_dir, built["avx2-unmarked"])
    args = [str(layout), "--run", *extra]
    if "--vm-kernel" not in extra:
        args += ["--vm-kernel", kernel]
    no_qemu_on_path = {"PATH": "/nonexistent"} if "--qemu-dir" in extra else None
    code, _, err = execwatch_scan(*args, env=no_qemu_on_path)
    assert code == 2
    assert err.count("\n") == 1 and words in err, err


def test_a_microvm_needs_no_user_namespace(
    built: dict[str, Path], shared_dir: Path, kernel: str
) -> None:
    """Where user namespaces are refused (here: inside one whose user.max_user_namespaces
    is 0), the namespace sandbox cannot run, the microVM still can."""
    refusing = ["unshare", "--user", "--map-root-user", "sh", "-c",
                'echo 0 > /proc/sys/user/max_user_namespaces && exec "$@"', "sh"]  # fmt: skip
    layout = layout_of(shared_dir, built["avx2-unmarked"])
    code, _, err = execwatch_scan(str(layout), "--run", user=refusing)
    assert code == 2 and "(user.max_user_namespaces = 0): cannot run" in err, err
    code, doc, err = execwatch_scan(str(layout), "--run", "--cpu-level", "x86-64-v2",
                                    "--vm-kernel", kernel, user=refusing)  # fmt: skip
    assert code == 1, err
    [run] = runs(doc)
    assert run["check"] == "cpu-level" and "killed by SIGILL" in run["message"]


def test_an_image_root_past_the_initramfs_budget_is_one_line(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "big").write_bytes(b"\0" * (2 << 20))
    vm = Vm("qemu", "vmlinuz", "Nehalem", init=str(root / "big"), max_initramfs=1 << 20)
    guest = Guest(str(root), ("/big",), {}, "/", 0, 0)
    with (tmp_path / "initramfs").open("wb") as out, pytest.raises(ScanInputError) as refused:
        write_initramfs(out, guest, vm, b"")
    assert str(refused.value) == (
        "--cpu-level: the image root exceeds the microVM's 1 MiB initramfs budget"
    )


def test_every_platform_and_the_cpu_level_in_one_scan(
    built: dict[str, Path], shared_dir: Path, kernel: str
) -> None:
    """amd64 in the v2 microVM (QEMU system from PATH), arm64 under user-mode QEMU from
    --qemu-dir: the level is an amd64 notion, the arm64 run is as without it."""
    amd64 = Image([[file("app", built["avx2-unmarked"].read_bytes())]], entrypoint=["/app"])
    layout = oci_layout(
        shared_dir / "img",
        [
            amd64,
            Image(
                [[*tree(ARM64_ROOT), *usrmerge(ARM64_ROOT)]],
                architecture="arm64",
                entrypoint=["/usr/bin/hello"],
            ),
        ],
    )
    code, doc, err = execwatch_scan(
        str(layout), "--run", "--cpu-level", "x86-64-v2", "--vm-kernel", kernel,
        "--qemu-dir", str(EMULATORS),
    )  # fmt: skip
    assert code == 1, err
    by_platform = {f["platform"]: f for f in runs(doc)}
    assert by_platform["linux/amd64"]["check"] == "cpu-level"
    assert "QEMU system (Nehalem): killed by SIGILL" in by_platform["linux/amd64"]["message"]
    assert by_platform["linux/arm64"]["check"] == "run-started"
    assert "under QEMU (binfmt_misc)" in by_platform["linux/arm64"]["message"]
