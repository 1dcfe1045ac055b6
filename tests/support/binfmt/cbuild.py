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


LEVEL_LIB_C = "int level_lib(void) { return 3; }\n"
USES_LEVEL_LIB_C = (
    "#include <stdio.h>\nint level_lib(void);\n"
    'int main(void) { printf("lib says %d\\n", level_lib()); return 0; }\n'
)


# An AVX2 instruction first thing: a CPU without it raises #UD, the kernel SIGILL.
AVX2_FIRST_C = (
    "#include <stdio.h>\n"
    'int main(void) { __asm__ volatile("vpxor %%ymm0, %%ymm0, %%ymm0" ::: "xmm0");'
    ' puts("avx2 ran"); return 0; }\n'
)


def build_level_programs(out: Path, level: str = "x86-64-v3") -> dict[str, Path]:
    """Programs that need an x86-64 ISA level: `needs-v3` itself, `uses-v3-lib` (built for
    the baseline) through `libv3.so`, found by $ORIGIN, and `static-v3`, musl and static:
    no loader checks it, its first instruction is AVX2. `-march` makes the code that
    level's, `-z` writes GNU_PROPERTY_X86_ISA_1_NEEDED, which glibc's loader checks."""
    flags = [f"-march={level}", f"-Wl,-z,{level}", "-O2"]
    lib = compile_c(out / "libv3.so", LEVEL_LIB_C, "gcc", "-shared", "-fPIC", *flags)
    return {
        "needs-v3": compile_c(out / "needs-v3", HELLO_C, "gcc", *flags),
        "libv3.so": lib,
        "uses-v3-lib": compile_c(
            out / "uses-v3-lib", USES_LEVEL_LIB_C, "gcc", f"-L{out}", "-l:libv3.so",
            "-Wl,-rpath,$ORIGIN",
        ),
        "static-v3": compile_c(out / "static-v3", AVX2_FIRST_C, "musl-gcc", "-static", *flags),
    }  # fmt: skip
