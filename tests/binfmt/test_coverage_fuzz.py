"""Coverage-guided fuzzing (atheris/libFuzzer) of the ELF, `#!`, OCI JSON, ld.so.conf,
layer tar and x86 ISA-level note parsers.

The harness (tests/binfmt/fuzz_target.py) fails an input that raises anything but the
parser's own error, peaks above 16 MiB of traced memory or takes over 5 s instrumented.
Seeds are real binaries of five architectures, built binaries and the hostile corpus;
libFuzzer mutates them (up to 64 KiB: instrumented parsing of larger inputs is too slow
for a useful number of runs; the hostile corpus covers large files) guided by coverage.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.binfmt.test_fuzz import seeds
from tests.binfmt.test_isa import HOSTILE_NOTES
from tests.support.binfmt.hostile_elf import CORPUS, SYMBOL_CORPUS
from tests.support.images.imagebuild import file, layer_tar, symlink

REPO = Path(__file__).parents[2]
RUNS = 30_000
MAX_SECONDS = 60


def write_seeds(directory: Path, foreign_root: Path, host_binaries: dict[str, Path]) -> None:
    hostile = [*CORPUS.values(), *SYMBOL_CORPUS.values()]
    elf = [*seeds(foreign_root, host_binaries), *(make() for make in hostile)]
    for i, data in enumerate(elf):
        if len(data) <= 1 << 20:
            (directory / f"elf-{i}").write_bytes(b"\0" + data[4:])  # selector 0, magic implied
    (directory / "shebang").write_bytes(b"\x01 /usr/bin/env -S python3 -u\r\n")
    (directory / "json").write_bytes(b'\x02{"manifests": [{"digest": "sha256:00", "a": [1]}]}')
    (directory / "conf").write_bytes(b"\x03include /etc/ld.so.conf.d/*.conf\n/usr/local/lib\n")
    entries = [
        file("bin/sh", b"#!/bin/dash\n"),
        symlink("lib", "usr/lib"),
        file("etc/a.conf", b"/x"),
    ]
    (directory / "tar").write_bytes(b"\x04" + layer_tar(entries))
    for name, (data, _) in HOSTILE_NOTES.items():
        (directory / f"note-{name}").write_bytes(b"\x05\x00" + data)


@pytest.mark.timeout(300)
def test_coverage_guided_fuzzing_finds_no_crash_slow_or_large_input(
    tmp_path: Path, foreign_root: Path, host_binaries: dict[str, Path]
) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    write_seeds(corpus, foreign_root, host_binaries)
    result = subprocess.run(
        [sys.executable, "-m", "tests.binfmt.fuzz_target", f"-runs={RUNS}",
         f"-max_total_time={MAX_SECONDS}", "-max_len=65536", "-rss_limit_mb=1024",
         f"-artifact_prefix={tmp_path}/", str(corpus)],
        cwd=REPO, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    output = result.stdout + result.stderr  # atheris prints a Python traceback on stdout
    lines = [line for line in output.splitlines() if not line.startswith("INFO: Instr")]
    log = "\n".join(lines)[-6000:]
    assert result.returncode == 0, log
    done = re.search(r"Done (\d+) runs", result.stderr)
    assert done is not None and int(done[1]) >= 1000, log  # a starved run proves nothing
    assert not list(tmp_path.glob("crash-*")), log
