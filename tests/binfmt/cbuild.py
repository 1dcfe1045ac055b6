"""Compile small C programs with the host's gcc and Debian's musl-gcc for tests."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

HELLO_C = '#include <stdio.h>\nint main(void) { puts("hi"); return 0; }\n'


def compile_c(out: Path, source: str, compiler: str = "gcc", *flags: str) -> Path:
    """Build `source` into `out`; a missing compiler fails the test (make test installs them)."""
    if shutil.which(compiler) is None:
        pytest.fail(f"{compiler} not found: run dev/setup.sh --test")
    src = out.with_suffix(".c")
    src.write_text(source)
    subprocess.run([compiler, "-o", str(out), str(src), *flags], check=True)
    return out
