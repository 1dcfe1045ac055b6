"""A run's outcome in the one vocabulary: Reason, from the wait status, the exec's errno and
the loader's own words on stderr (FACTS.md, "After a successful exec")."""

from __future__ import annotations

import errno
import os
import re
import signal
from dataclasses import dataclass

from execwatch.binfmt.elf import read_elf
from execwatch.runnable.openat2 import Resolver, Root
from execwatch.runnable.reason import Reason
from execwatch.smoke.namespaces import ProcessEnd

# (pattern on stderr, reason): the loaders' messages, glibc's then musl's then QEMU's.
LOADER_WORDS: tuple[tuple[re.Pattern[bytes], Reason], ...] = (
    (re.compile(rb"CPU ISA level is lower than required"), Reason.UNSUPPORTED_CPU),
    (
        re.compile(rb"error while loading shared libraries: [^:]+: cannot open"),
        Reason.MISSING_LIBRARY,
    ),
    (re.compile(rb"version `[^']+' not found \(required by"), Reason.MISSING_SYMBOL_VERSION),
    (re.compile(rb"symbol lookup error: .*undefined symbol"), Reason.MISSING_SYMBOL),
    (re.compile(rb"Error loading shared library [^:]+: No such file"), Reason.MISSING_LIBRARY),
    (re.compile(rb"Error relocating [^:]+: [^:]+: symbol not found"), Reason.MISSING_SYMBOL),
    (re.compile(rb"qemu-[a-z0-9_]+: Could not open '[^']+'"), Reason.MISSING_INTERPRETER),
)
# ENOEXEC's name in a run's message: Reason ForeignArchitecture (or MissingShebang) is
# the vocabulary, and the Kubernetes Event reason for it is ExecFormatError too.
EXEC_FORMAT_ERROR = "ExecFormatError (ENOEXEC)"
LIBC_SYMPTOMS = frozenset(
    {Reason.MISSING_LIBRARY, Reason.MISSING_SYMBOL, Reason.MISSING_SYMBOL_VERSION}
)
LIMIT_SIGNALS: dict[int, str] = {
    signal.SIGXCPU: "its CPU-time limit",
    signal.SIGXFSZ: "its file-size limit",
}


@dataclass(frozen=True)
class RunVerdict:
    started: bool
    reason: Reason | None  # None when it started
    detail: str


def classify(outcome: ProcessEnd, root: str, timeout_fails: bool = False) -> RunVerdict:
    """What happened to the program, in the words of the node's diagnoses, with the last
    line it wrote on stderr."""
    verdict = _classify(outcome, root, timeout_fails)
    lines = outcome.stderr.strip().splitlines()
    if not lines:
        return verdict
    last = lines[-1][:200].decode(errors="replace")
    return RunVerdict(verdict.started, verdict.reason, f"{verdict.detail}; stderr: {last}")


def _classify(outcome: ProcessEnd, root: str, timeout_fails: bool) -> RunVerdict:
    if outcome.exec_errno is not None:
        return _refused(outcome.exec_errno, outcome.program, root)
    if outcome.timed_out:
        text = "still running at the deadline (a server that does not exit)"
        return RunVerdict(not timeout_fails, Reason.UNDIAGNOSED if timeout_fails else None, text)
    status = outcome.status if outcome.status is not None else 0
    if os.WIFSIGNALED(status):
        return _signaled(os.WTERMSIG(status), outcome, root)
    code = os.WEXITSTATUS(status)
    for pattern, reason in LOADER_WORDS:
        match = pattern.search(outcome.stderr)
        if code != 0 and match:
            words = match.group(0).decode(errors="replace")
            if reason in LIBC_SYMPTOMS and _libc_mismatch(outcome.program, root):
                reason = Reason.LIBC_MISMATCH  # musl's complaints about a glibc program
            return RunVerdict(False, reason, f"exit {code}: the loader says: {words}")
    return RunVerdict(True, None, f"started: exit {code}")


def _refused(err: int, program: str | None, root: str) -> RunVerdict:
    name = program or "(none)"
    text = f"exec {name}: {os.strerror(err)}"
    head = _head(program, root) if program else b""
    if err == errno.ENOENT:
        if not head:
            return RunVerdict(False, Reason.NOT_FOUND, f"{text}: not in the image")
        if head.startswith(b"#!"):
            return RunVerdict(
                False, Reason.MISSING_SHEBANG_INTERPRETER, f"{text}: its #! interpreter"
            )
        return RunVerdict(False, Reason.MISSING_INTERPRETER, f"{text}: its ELF loader (PT_INTERP)")
    if err == errno.ENOEXEC:  # no binfmt handler takes the file: named as the issue names it
        text = f"{text}: {EXEC_FORMAT_ERROR}"
        if head.startswith(b"\x7fELF"):
            return RunVerdict(False, Reason.FOREIGN_ARCHITECTURE, f"{text}, no binfmt interpreter")
        return RunVerdict(False, Reason.MISSING_SHEBANG, f"{text}, no #! line")
    if err == errno.EACCES:
        return RunVerdict(False, Reason.PERMISSION_DENIED, text)
    return RunVerdict(False, Reason.UNDIAGNOSED, text)


def _signaled(sig: int, outcome: ProcessEnd, root: str) -> RunVerdict:
    name = signal.Signals(sig).name if sig in signal.Signals.__members__.values() else str(sig)
    if sig in LIMIT_SIGNALS:
        return RunVerdict(True, None, f"started, then stopped by {LIMIT_SIGNALS[sig]} ({name})")
    if sig == signal.SIGILL:
        return RunVerdict(
            False, Reason.UNSUPPORTED_CPU, f"killed by {name}: an instruction the CPU lacks"
        )
    if _libc_mismatch(outcome.program, root):
        return RunVerdict(False, Reason.LIBC_MISMATCH, f"killed by {name}: a glibc program on musl")
    return RunVerdict(False, Reason.STARTUP_CRASH, f"killed by {name} at start-up")


def _open(program: str, root: str) -> int | None:
    resolver, base = Resolver(), Root(os.open(root, os.O_PATH | os.O_DIRECTORY), root)
    try:
        return resolver.open_regular(base, program)
    except OSError:
        return None
    finally:
        base.close()


def _head(program: str, root: str) -> bytes:
    fd = _open(program, root)
    if fd is None:
        return b""
    with os.fdopen(fd, "rb") as f:
        return f.read(64)


def _libc_mismatch(program: str | None, root: str) -> bool:
    """A glibc program (its PT_INTERP is ld-linux) in a root whose loader is musl's."""
    fd = _open(program, root) if program else None
    if fd is None:
        return False
    try:
        with os.fdopen(fd, "rb") as f:
            interp = read_elf(f).interpreter or ""
    except Exception:  # not an ELF, or a corrupt one: not this case
        return False
    lib = os.path.join(root, "lib")
    if os.path.islink(lib) and os.readlink(lib).startswith("/"):
        return False  # never a host directory
    musl = os.path.isdir(lib) and any(n.startswith("ld-musl-") for n in os.listdir(lib))
    return "ld-linux" in interp and musl
