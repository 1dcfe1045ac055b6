"""Issue 37's proof, as one table: each case a real image (or a build's output and the base
it will run on), the `execwatch scan` argv that checks it, who runs it, and what the report
must say. The host kernel's tests (tests/smoke/test_cases.py) and the oldest guest
kernel's (tests/kernels/test_smoke_oldest.py) build, run and judge the same cases, so the
two cannot drift.

Materials are real: programs built here with gcc and musl-gcc, the host's glibc and musl
loaders, Debian trixie's hello (dev/fetch-newer.sh), Debian's arm64 hello root
(dev/fetch-foreign.sh), qemu-aarch64-static (dev/fetch-emulators.sh) and Debian bookworm's
minbase root (dev/images.sh). Paths in a case's argv are relative to the directory it was
built in (the guest sees that directory at another path), or absolute under the
repository, which the guest sees at the same path.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.binfmt.cbuild import HELLO_C, compile_c
from tests.support.images.base_images import MUSL_LOADER, glibc_base, host_glibc, musl_base
from tests.support.images.imagebuild import Entry, Image, file, oci_layout, symlink, tree, usrmerge

REPO = Path(__file__).resolve().parents[3]
CACHE = Path(os.environ.get("EXECWATCH_CACHE", REPO / ".cache"))
EMULATORS = CACHE / "emulators"
ARM64_ROOT = CACHE / "foreign" / "arm64" / "root"
TRIXIE_HELLO = CACHE / "newer" / "hello" / "usr/bin/hello"
DEBIAN_ROOTFS = CACHE / "images" / "debian.rootfs.tar"
BINFMT_IN_USERNS = (6, 7)  # the kernel whose user namespaces have a binfmt_misc of their own
# A constructor that needs a file the image lacks and uses the NULL it gets: a real fault
# (a raise() would be ignored, as any default-action signal sent to a namespace's PID 1)
CRASH_C = (
    "#include <stdio.h>\n"
    "__attribute__((constructor)) static void init(void) {\n"
    '  FILE *f = fopen("/etc/app.conf", "r"); fgetc(f); }\n'
    'int main(void) { puts("hi"); return 0; }\n'
)
# GNU strerror_r returns the message (char *); musl's, which gcompat's layout binds it to,
# returns an int (0): the program then reads its "string" at address 0 (FACTS.md: the
# seed's gcompat variant, exit 139).
STRERROR_R_C = (
    "#define _GNU_SOURCE\n#include <stdio.h>\n#include <string.h>\n"
    "int main(void) { char buf[64];\n"
    '  printf("%s\\n", strerror_r(2, buf, sizeof buf)); return 0; }\n'
)


@dataclass(frozen=True)
class Materials:
    """The real binaries the cases are made of."""

    glibc: Path  # gcc's hello: the seed's oberon-runner
    musl_static: Path
    crash: Path  # a glibc program whose constructor dies of SIGSEGV
    strerror_r: Path  # a glibc program that dies of SIGSEGV under musl's loader

    @classmethod
    def build(cls, d: Path) -> Materials:
        """Compiled into `d`; an AssertionError names a cached material that is missing."""
        for need in (EMULATORS / "qemu-aarch64-static", ARM64_ROOT / "usr/bin/hello",
                     TRIXIE_HELLO, DEBIAN_ROOTFS, MUSL_LOADER):  # fmt: skip
            if not need.exists():
                raise AssertionError(f"{need} missing: run dev/setup.sh --test")
        d.mkdir(parents=True, exist_ok=True)
        return cls(
            glibc=compile_c(d / "hello-glibc", HELLO_C, "gcc"),
            musl_static=compile_c(d / "hello-musl-static", HELLO_C, "musl-gcc", "-static"),
            crash=compile_c(d / "crash", CRASH_C, "gcc"),
            strerror_r=compile_c(d / "strerror-r", STRERROR_R_C, "gcc"),
        )


@dataclass(frozen=True)
class Expect:
    """What the report says: exit code, static findings as (check, severity), each
    platform's run check, words its message must hold, and the disagreement named."""

    code: int
    static: frozenset[tuple[str, str]] = frozenset()
    runs: dict[str, str] = field(default_factory=dict)  # platform -> run check
    run_says: dict[str, str] = field(default_factory=dict)  # platform -> words in the message
    static_says: str = ""
    disagreement: str | None = None  # words of the run's disagreement; None: it agrees
    note: str = ""  # words of the image's first note


@dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[Materials, Path], list[str]]  # makes its files in a dir, returns argv
    expect: Expect
    users: tuple[str, ...] = ("root",)
    env: dict[str, str] = field(default_factory=dict)

    def key(self, user: str) -> str:
        return self.name if user == "root" else f"{self.name}-as-{user}"

    def steps(self, m: Materials, d: Path) -> dict[str, dict[str, Any]]:
        """Its files made in `d`; one scan per user (scan_process.run_scan), keyed by
        `name` as root and `name-as-USER` otherwise."""
        d.mkdir(parents=True)
        d.chmod(0o755)  # nobody reads it too
        argv = self.build(m, d)
        return {
            self.key(u): {
                "case": self.name, "argv": argv, "user": u, "cwd": str(d), "env": self.env
            }
            for u in self.users
        }  # fmt: skip


@dataclass(frozen=True)
class Outcome:
    """One `execwatch scan --format json` process: what the judge reads."""

    code: int
    doc: dict[str, Any]
    stderr: str
    kernel: str  # uname -r where it ran: which QEMU path the kernel allows

    @classmethod
    def of(cls, result: dict[str, Any]) -> Outcome:
        """From scan_process.run_scan's result."""
        doc = json.loads(result["stdout"]) if result["stdout"].strip() else {}
        return cls(result["code"], doc, result["stderr"], result["kernel"])

    def runs(self) -> list[dict[str, Any]]:
        return [f for f in self.doc.get("findings", []) if f.get("source") == "run"]


def _musl(extra: list[Entry]) -> list[Entry]:
    """An Alpine-like root (base_images.musl_base) and `extra`."""
    return [*musl_base(MUSL_LOADER.resolve().read_bytes()), *extra]


def _one(d: Path, layer: list[Entry], entry: str) -> list[str]:
    oci_layout(d / "img", [Image([layer], entrypoint=[entry])])
    return ["img", "--run"]


def glibc_on_musl(m: Materials, d: Path) -> list[str]:
    return _one(d, _musl([file("app/hello", m.glibc.read_bytes())]), "/app/hello")


def gcompat(m: Materials, d: Path) -> list[str]:
    """musl's loader in ld-linux's place, as gcompat installs it."""
    layer = _musl([symlink("lib64/ld-linux-x86-64.so.2", "/lib/ld-musl-x86_64.so.1"),
                   file("app/strerror", m.strerror_r.read_bytes())])  # fmt: skip
    return _one(d, layer, "/app/strerror")


def glibc_2_38(m: Materials, d: Path) -> list[str]:
    """Trixie's hello over the host's bookworm loader and libc (GLIBC_2.36)."""
    layer = [*glibc_base(host_glibc()), file("usr/bin/hello", TRIXIE_HELLO.read_bytes())]
    return _one(d, layer, "/usr/bin/hello")


def constructor_crash(m: Materials, d: Path) -> list[str]:
    return _one(
        d, [*glibc_base(host_glibc()), file("app/crash", m.crash.read_bytes())], "/app/crash"
    )


def _arm64_hello() -> Image:
    layer = [*tree(ARM64_ROOT), *usrmerge(ARM64_ROOT)]
    return Image([layer], architecture="arm64", entrypoint=["/usr/bin/hello"])


def _static(m: Materials, arch: str = "amd64") -> Image:
    layer = [file("hello", m.musl_static.read_bytes())]
    return Image([layer], architecture=arch, entrypoint=["/hello"])


def multi_arch(m: Materials, d: Path) -> list[str]:
    oci_layout(d / "img", [_static(m), _arm64_hello()])
    return ["img", "--run", "--qemu-dir", str(EMULATORS)]


def arm64_holds_x86_64(m: Materials, d: Path) -> list[str]:
    oci_layout(d / "img", [_static(m), _static(m, "arm64")])
    return ["img", "--run", "--qemu-dir", str(EMULATORS)]


def _program(m: Materials, d: Path) -> str:
    (d / "oberon-runner").write_bytes(m.glibc.read_bytes())
    (d / "oberon-runner").chmod(0o755)
    return "oberon-runner"


def base_musl(m: Materials, d: Path) -> list[str]:
    oci_layout(d / "musl", [Image([_musl([])])])
    return [_program(m, d), "--base", "musl", "--run"]


def base_debian(m: Materials, d: Path) -> list[str]:
    return [_program(m, d), "--base", str(DEBIAN_ROOTFS)]


def base_glibc_run(m: Materials, d: Path) -> list[str]:
    oci_layout(d / "glibc", [Image([glibc_base(host_glibc())])])
    return [_program(m, d), "--base", "glibc", "--run", "--at", "/srv"]


def dist(m: Materials, d: Path) -> list[str]:
    """A build's output: a dynamic binary and a `#!/usr/bin/env bash` script."""
    out = d / "dist"
    out.mkdir()
    _program(m, out)
    (out / "start.sh").write_bytes(b"#!/usr/bin/env bash\necho hi\n")
    (out / "start.sh").chmod(0o755)
    return ["dist"]


AMD64, ARM64 = "linux/amd64", "linux/arm64"
EMULATED = "under QEMU ({qemu})"  # {qemu}: the path this kernel allows (qemu_path)
# fmt: off
CASES = (
    Case("glibc-on-musl", glibc_on_musl, Expect(
        1, frozenset({("missing-interpreter", "error")}), {AMD64: "missing-interpreter"},
        {AMD64: "its ELF loader"},
        static_says="a glibc binary in a musl image (no such file or directory, exit 127)",
    ), users=("root", "nobody")),
    Case("gcompat", gcompat, Expect(
        1, frozenset({("libc-mismatch", "warning")}), {AMD64: "libc-mismatch"},
        {AMD64: "killed by SIGSEGV"}, static_says="crash at run time (SIGSEGV, exit 139)",
        disagreement="the static side says it runs",  # a warning: gcompat lets it load
    )),
    Case("glibc-2.38-on-an-older-base", glibc_2_38, Expect(
        1, frozenset({("missing-symbol-version", "error")}), {AMD64: "missing-symbol-version"},
        {AMD64: "exit 1: the loader says: version `GLIBC_2.38' not found"},
    )),
    Case("multi-arch", multi_arch, Expect(
        0, runs={AMD64: "run-started", ARM64: "run-started"}, run_says={ARM64: EMULATED},
    )),
    Case("multi-arch-qemu-direct", multi_arch, Expect(
        0, runs={AMD64: "run-started", ARM64: "run-started"},
        run_says={ARM64: "under QEMU (direct)"},
    ), env={"EXECWATCH_RUN_QEMU": "direct"}),
    Case("arm64-entry-holding-x86-64", arm64_holds_x86_64, Expect(
        1, frozenset({("arch-mismatch", "error")}), {AMD64: "run-started", ARM64: "arch-mismatch"},
        {ARM64: "Exec format error: ExecFormatError (ENOEXEC), no binfmt interpreter"},
    )),
    Case("constructor-crash", constructor_crash, Expect(
        1, runs={AMD64: "startup-crash"}, run_says={AMD64: "killed by SIGSEGV at start-up"},
        disagreement="the static side says it runs, but the run failed (StartupCrash)",
    )),
    Case("base-musl", base_musl, Expect(
        1, frozenset({("missing-interpreter", "error")}), {AMD64: "missing-interpreter"},
        static_says="a glibc binary in a musl image", note="placed at /app over",
    )),
    Case("base-debian", base_debian, Expect(0, note="placed at /app over")),
    Case("base-glibc-run", base_glibc_run, Expect(
        0, runs={AMD64: "run-started"}, note="placed at /srv over",
    )),
    Case("dist-without-base", dist, Expect(0, note="not a root filesystem")),
)
# fmt: on


def qemu_path(kernel: str) -> str:
    """binfmt_misc in the sandbox's own user namespace from Linux 6.7, else QEMU direct."""
    major, minor = (int(x) for x in kernel.split(".")[:2])
    return "binfmt_misc" if (major, minor) >= BINFMT_IN_USERNS else "direct"


def judge(case: Case, out: Outcome) -> None:
    """Assert what `case.expect` says of one scan's outcome."""
    e, doc = case.expect, out.doc
    assert out.code == e.code, f"{case.name}: exit {out.code}: {out.stderr}{doc}"
    static = [f for f in doc["findings"] if f["source"] == "static"]
    assert {(f["check"], f["severity"]) for f in static} == e.static, f"{case.name}: {static}"
    assert all(e.static_says in f["message"] for f in static), f"{case.name}: {static}"
    by_platform = {f["platform"]: f for f in out.runs()}
    assert len(by_platform) == len(out.runs()), f"{case.name}: {out.runs()}"
    assert {p: f["check"] for p, f in by_platform.items()} == e.runs, f"{case.name}: {out.runs()}"
    for platform, words in e.run_says.items():
        words = words.format(qemu=qemu_path(out.kernel))
        assert words in by_platform[platform]["message"], f"{case.name}: {by_platform[platform]}"
    for f in by_platform.values():
        said = f.get("disagreement")
        assert (said is None) if e.disagreement is None else (e.disagreement in (said or "")), f
    if AMD64 in by_platform:
        assert "QEMU" not in by_platform[AMD64]["message"], by_platform[AMD64]
    if e.note:
        assert e.note in doc["images"][0]["notes"][0], f"{case.name}: {doc['images']}"


def plan(m: Materials, d: Path) -> dict[str, dict[str, Any]]:
    """Every case made under `d`, each in a directory of its own: key -> scan step."""
    d.mkdir(parents=True, exist_ok=True)
    d.chmod(0o755)
    return {k: v for case in CASES for k, v in case.steps(m, d / case.name).items()}


def scan_keys() -> list[tuple[str, Case]]:
    """Each scan's key (Case.steps) and its case, in the table's order."""
    return [(case.key(user), case) for case in CASES for user in case.users]
