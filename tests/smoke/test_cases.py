"""Issue 37's proof on this machine's kernel: every case of the one table
(tests/support/smoke/smoke_cases.py), each built from real binaries, scanned with --run by
a real `execwatch scan` process and judged by the table's own expectations. The same cases
run on the oldest guest kernel in tests/kernels/test_smoke_oldest.py.

- a glibc program on a musl base: exit 127, MissingInterpreter, static and run, as root
  and as nobody;
- its gcompat variant (musl's loader as ld-linux): SIGSEGV, exit 139, LibcMismatch from
  the run; the static side only warns, so the disagreement is named;
- a program needing GLIBC_2.38 on a glibc 2.36 base: MissingSymbolVersion, both sides;
- an honest multi-arch image: amd64 native, arm64 under QEMU (the kernel's own path, and
  QEMU run directly), both started;
- an index whose arm64 entry holds x86-64 binaries: ExecFormatError (ENOEXEC) on arm64;
- a constructor crash no static rule can see: StartupCrash, the disagreement named;
- `--base`: the seed's program on a musl base (error, static and run), on Debian's
  (clean), on a glibc base with --run (started), and a build's ./dist without --base
  (no false error).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.smoke.scan_process import run_scan
from tests.support.smoke.smoke_cases import Case, Materials, Outcome, judge, scan_keys


@pytest.fixture(scope="module")
def materials(tmp_path_factory: pytest.TempPathFactory) -> Materials:
    return Materials.build(tmp_path_factory.mktemp("smoke-materials"))


@pytest.mark.parametrize(("key", "case"), [pytest.param(k, c, id=k) for k, c in scan_keys()])
def test_the_case_says_what_the_table_says(
    key: str, case: Case, materials: Materials, shared_dir: Path
) -> None:
    step = case.steps(materials, shared_dir / case.name)[key]
    judge(case, Outcome.of(run_scan(step)))
