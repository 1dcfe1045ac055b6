"""Unpacked Debian packages of other architectures (dev/fetch-foreign.sh): the real
foreign binaries and roots the emulation and audit tests and benchmarks run."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
FOREIGN = REPO / ".cache" / "foreign"
