"""The one vocabulary for why a binary does not start: the node's diagnoses and the scan's
findings both speak it (the scan spells it as check names: scan/vocabulary.py), and the
words a reason's detail shares between the node's diagnosis and the handler's Events."""

from __future__ import annotations

import enum


class Reason(enum.StrEnum):
    """Why an exec failed, or why a process died right after its exec.

    Values are stable: they become metric labels, Event reasons and the CRD's enum; the
    deploy tests compare those (and the docs tables) against this enum."""

    FOREIGN_ARCHITECTURE = "ForeignArchitecture"
    FOREIGN_OS = "ForeignOS"  # an executable of another OS: Mach-O, PE, a.out, a BSD's ELF
    MISSING_INTERPRETER = "MissingInterpreter"
    BAD_INTERPRETER = "BadInterpreter"
    MISSING_SHEBANG_INTERPRETER = "MissingShebangInterpreter"
    NO_SHEBANG = "NoShebang"
    MISSING_SHEBANG = "MissingShebang"  # no #! line, and the caller did not retry: a failed start
    CORRUPT_BINARY = "CorruptBinary"
    PERMISSION_DENIED = "PermissionDenied"
    NOT_FOUND = "NotFound"
    UNDIAGNOSED = "Undiagnosed"
    # After a successful exec: the dynamic loader gave up, or the program died at once.
    MISSING_LIBRARY = "MissingLibrary"
    MISSING_SYMBOL_VERSION = "MissingSymbolVersion"
    MISSING_SYMBOL = "MissingSymbol"
    LIBC_MISMATCH = "LibcMismatch"
    UNSUPPORTED_CPU = "UnsupportedCPU"
    STARTUP_CRASH = "StartupCrash"
    # A successful exec that a binfmt_misc emulator (user-mode QEMU) runs: slowly.
    EMULATED = "Emulated"
    BENIGN_EXIT = "BenignExit"  # e.g. a shell's "command not found" (127): counted, not reported


def emulated_detail(arch: str | None, emulator: str | None, node_arch: str) -> str:
    """An exec a binfmt_misc emulator ran (Reason.EMULATED): the diagnosis's detail, which
    the trace line shows, and the pod's Event too (the handler words it from the record)."""
    arch = arch or "foreign"
    article = "an" if arch[:1] in "aeiou" else "a"
    return (
        f"{article} {arch} binary ran under {emulator or 'an emulator'} on this {node_arch}"
        " node (binfmt_misc emulation: slow, and it would fail with exec format error"
        " elsewhere)"
    )
