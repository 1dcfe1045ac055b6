"""The one vocabulary for why a binary does not start: the node's diagnoses and the scan's
findings both speak it (the scan spells it as check names: scan/vocabulary.py)."""

from __future__ import annotations

import enum


class Reason(enum.StrEnum):
    """Why an exec failed, or why a process died right after its exec.

    Values are stable: they become metric labels, Event reasons and the CRD's enum; the
    deploy tests compare those (and the docs tables) against this enum."""

    FOREIGN_ARCHITECTURE = "ForeignArchitecture"
    MISSING_INTERPRETER = "MissingInterpreter"
    BAD_INTERPRETER = "BadInterpreter"
    MISSING_SHEBANG_INTERPRETER = "MissingShebangInterpreter"
    NO_SHEBANG = "NoShebang"
    MISSING_SHEBANG = "MissingShebang"
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
