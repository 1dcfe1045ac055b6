"""How the node words the rules' faults in a Diagnosis detail (the scan words the same
faults in scan/wording.py; what the handler's Events say too is in runnable/reason.py)."""

from __future__ import annotations

import signal
from dataclasses import replace

from execwatch.binfmt.shebang import CAUSE_HEAD_BYTES, why_no_shebang
from execwatch.record import Reason
from execwatch.runnable.rules import Fault


def exec_detail(fault: Fault, node_arch: str) -> str:
    """A fault that explains a failed exec."""
    if fault.reason is Reason.FOREIGN_ARCHITECTURE:
        return f"an {fault.arch} binary cannot run on this {node_arch} node"
    if fault.reason is Reason.MISSING_INTERPRETER:
        return (
            f"the ELF loader {fault.interpreter} does not exist in this root filesystem"
            " (e.g. a glibc binary in a musl image)"
        )
    if fault.reason is Reason.BAD_INTERPRETER and fault.arch is not None:
        return f"the loader is an {fault.arch} binary"
    return fault.detail


def startup_fault(fault: Fault) -> Fault:
    """A fault that explains an early death, its detail completed."""
    if fault.reason is Reason.LIBC_MISMATCH:
        why = ", as gcompat installs it: symbols resolve against the wrong C library"
        return replace(fault, detail=fault.detail + why)
    if fault.reason is Reason.UNSUPPORTED_CPU:
        return replace(fault, detail=f"{fault.detail}: CPU ISA level is lower than required")
    if fault.reason is Reason.MISSING_SYMBOL and fault.library:
        return replace(fault, detail=f"{fault.detail} (not in {fault.library})")
    return fault


def sigill(fault: Fault) -> Fault:
    """A CPU level no loader checked: the CPU stopped the program."""
    return replace(
        fault, detail=f"{fault.detail}: no loader checks it, the CPU stops it with SIGILL"
    )


def no_shebang(head: bytes) -> str:
    """A file that is neither ELF nor #! (ENOEXEC): what it starts with, and the likely cause.
    The pipeline adds what its caller did next (pipeline.fates)."""
    shown = head[:CAUSE_HEAD_BYTES].decode("ascii", "surrogateescape")  # escaped by each output
    more = "…" if len(head) > CAUSE_HEAD_BYTES else ""
    return f'neither ELF nor #!: {why_no_shebang(head)} (first bytes: "{shown}"{more})'


def exit_status(exit_code: int | None, signal_number: int | None) -> str:
    """How a task ended, as a detail says it."""
    if signal_number:
        try:
            name = signal.Signals(signal_number).name
        except ValueError:
            name = f"signal {signal_number}"
        return f"was killed by {name}"
    return f"exited with status {exit_code}"
