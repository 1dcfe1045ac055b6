"""ruff and mypy are part of the test suite: a lint or type error fails the build."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True)


def test_ruff_lint() -> None:
    out = run(str(BIN / "ruff"), "check", ".")
    assert out.returncode == 0, out.stdout + out.stderr


def test_ruff_format() -> None:
    out = run(str(BIN / "ruff"), "format", "--check", ".")
    assert out.returncode == 0, out.stdout + out.stderr


def test_mypy_strict() -> None:
    out = run(str(BIN / "mypy"))
    assert out.returncode == 0, out.stdout + out.stderr
