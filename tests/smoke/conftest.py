"""Real binaries and images for the --run tests: host gcc and musl-gcc builds, Debian's
arm64 hello root (dev/fetch-foreign.sh) and qemu-aarch64-static (dev/fetch-emulators.sh)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.binfmt.cbuild import HELLO_C, compile_c

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("EXECWATCH_CACHE", REPO / ".cache"))
EMULATORS = CACHE / "emulators"
ARM64_ROOT = CACHE / "foreign" / "arm64" / "root"
NOBODY = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
# A constructor that needs a file the image lacks and uses the NULL it gets: a real fault
# (a raise() would be ignored, as any default-action signal sent to a namespace's PID 1)
CRASH_C = (
    "#include <stdio.h>\n"
    "__attribute__((constructor)) static void init(void) {\n"
    '  FILE *f = fopen("/etc/app.conf", "r"); fgetc(f); }\n'
    'int main(void) { puts("hi"); return 0; }\n'
)


@pytest.fixture(scope="session")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("smoke-bin")
    for need in (EMULATORS / "qemu-aarch64-static", ARM64_ROOT / "usr/bin/hello"):
        if not need.exists():
            pytest.fail(f"{need} missing: run dev/setup.sh --test")
    return {
        "glibc": compile_c(d / "hello-glibc", HELLO_C, "gcc"),
        "musl-static": compile_c(d / "hello-musl-static", HELLO_C, "musl-gcc", "-static"),
        "crash": compile_c(d / "crash", CRASH_C, "gcc"),
    }


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory every user can read: the unprivileged runs read their images here."""
    d = Path(tempfile.mkdtemp(prefix="execwatch-smoke-test-"))
    d.chmod(0o755)
    yield d
    subprocess.run(["rm", "-rf", str(d)], check=False)


def execwatch_scan(
    *argv: str, user: list[str] | None = None, env: dict[str, str] | None = None
) -> tuple[int, dict[str, Any], str]:
    """`execwatch scan ... --format json` as a process of its own (as `user`, e.g. NOBODY)."""
    cmd = [*(user or []), sys.executable, "-m", "execwatch.cli", "scan", "--no-progress",
           "--format", "json", *argv]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd="/",
                          env={**os.environ, **(env or {})})  # fmt: skip
    doc = json.loads(proc.stdout) if proc.stdout.strip() else {}
    return proc.returncode, doc, proc.stderr


def runs(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in doc.get("findings", []) if f.get("source") == "run"]
