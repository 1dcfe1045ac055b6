"""The scan's check names: Reason, spelled for JSON, SARIF rule ids and JUnit test names.

The one table between the two: a check the rules report is the spelling of exactly one
Reason, and back. Three static checks are the scan's own and no Reason: `not-static` is a policy
(--require-static), not a failure; `shebang-crlf` says why a `#!` interpreter will be
missing even where the scan cannot look for it (the node reports that case as
MissingShebangInterpreter, with the CR in its detail); `env-not-on-PATH` is the failure of
`env`'s own PATH lookup, after the script's exec succeeded. Two are the runs' own
(`--run`): `run-started`, and `run-failed` for a failure no other check names.
"""

from __future__ import annotations

import enum

from execwatch.runnable.reason import Reason


class Check(enum.StrEnum):
    """Stable check ids: they appear in JSON, SARIF rule ids and JUnit test names."""

    ARCH_MISMATCH = "arch-mismatch"
    FOREIGN_OS = "foreign-os"
    MISSING_INTERPRETER = "missing-interpreter"
    BAD_INTERPRETER = "bad-interpreter"
    MISSING_LIBRARY = "missing-library"
    MISSING_SYMBOL_VERSION = "missing-symbol-version"
    MISSING_SYMBOL = "missing-symbol"
    LIBC_MISMATCH = "libc-mismatch"
    MISSING_SHEBANG_INTERPRETER = "missing-shebang-interpreter"
    MISSING_SHEBANG = "missing-shebang"
    SHEBANG_CRLF = "shebang-crlf"
    ENV_NOT_ON_PATH = "env-not-on-PATH"
    NOT_STATIC = "not-static"
    MISSING_ENTRYPOINT = "missing-entrypoint"
    CORRUPT_BINARY = "corrupt-binary"
    CPU_LEVEL = "cpu-level"
    STARTUP_CRASH = "startup-crash"
    RUN_STARTED = "run-started"
    RUN_FAILED = "run-failed"


CHECK_OF_REASON: dict[Reason, Check] = {
    Reason.FOREIGN_ARCHITECTURE: Check.ARCH_MISMATCH,
    Reason.FOREIGN_OS: Check.FOREIGN_OS,
    Reason.MISSING_INTERPRETER: Check.MISSING_INTERPRETER,
    Reason.BAD_INTERPRETER: Check.BAD_INTERPRETER,
    Reason.MISSING_LIBRARY: Check.MISSING_LIBRARY,
    Reason.MISSING_SYMBOL_VERSION: Check.MISSING_SYMBOL_VERSION,
    Reason.MISSING_SYMBOL: Check.MISSING_SYMBOL,
    Reason.LIBC_MISMATCH: Check.LIBC_MISMATCH,
    Reason.MISSING_SHEBANG_INTERPRETER: Check.MISSING_SHEBANG_INTERPRETER,
    Reason.MISSING_SHEBANG: Check.MISSING_SHEBANG,
    Reason.NOT_FOUND: Check.MISSING_ENTRYPOINT,
    Reason.CORRUPT_BINARY: Check.CORRUPT_BINARY,
    Reason.UNSUPPORTED_CPU: Check.CPU_LEVEL,
    Reason.STARTUP_CRASH: Check.STARTUP_CRASH,
}
REASON_OF_CHECK: dict[Check, Reason] = {c: r for r, c in CHECK_OF_REASON.items()}
SCAN_ONLY = frozenset(
    {
        Check.NOT_STATIC,
        Check.SHEBANG_CRLF,
        Check.ENV_NOT_ON_PATH,
        Check.RUN_STARTED,
        Check.RUN_FAILED,
    }
)

CHECK_DESCRIPTIONS: dict[Check, str] = {
    Check.ARCH_MISMATCH: "ELF machine, class, endianness or variant does not run on the platform",
    Check.FOREIGN_OS: "an executable of another OS: Mach-O, PE, a.out or a BSD's ELF",
    Check.MISSING_INTERPRETER: "the ELF loader named in PT_INTERP is absent (glibc on musl too)",
    Check.BAD_INTERPRETER: "the ELF loader named in PT_INTERP is not an ELF of the binary's ABI",
    Check.MISSING_LIBRARY: "a DT_NEEDED library cannot be found by the image's loader rules",
    Check.MISSING_SYMBOL_VERSION: "a required symbol version is not defined by the library",
    Check.MISSING_SYMBOL: "an imported symbol no loaded library exports (a root on disk only)",
    Check.LIBC_MISMATCH: "the loader is the other C library's: a glibc binary under gcompat's musl",
    Check.MISSING_SHEBANG_INTERPRETER: "the #! interpreter is absent from the image",
    Check.MISSING_SHEBANG: "a program the container starts is neither ELF nor a #! script",
    Check.SHEBANG_CRLF: "the #! line ends in CR: the kernel looks for an interpreter ending in \\r",
    Check.ENV_NOT_ON_PATH: "the command given to #!/usr/bin/env is not on the image's PATH",
    Check.NOT_STATIC: "the executable is dynamically linked but --require-static was given",
    Check.MISSING_ENTRYPOINT: "the image's entrypoint/cmd program does not exist",
    Check.CORRUPT_BINARY: "the file starts like an ELF but its headers are malformed",
    Check.CPU_LEVEL: "an executable or a library it loads needs an x86-64 level the CPUs lack",
    Check.STARTUP_CRASH: "the program died of a signal at start-up (--run)",
    Check.RUN_STARTED: "the entrypoint started in the sandbox (--run)",
    Check.RUN_FAILED: "the entrypoint could not be started in the sandbox (--run)",
}
