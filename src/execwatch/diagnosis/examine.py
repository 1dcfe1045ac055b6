"""A failed exec's file, judged by the rules, and the fault that explains the errno.

The rules (execwatch.runnable.rules, the ones `execwatch scan` applies) say what is wrong
with the file; this module reads it, its ELF loader or its `#!` interpreter inside the
caller's root, and picks what explains the errno: ENOEXEC a foreign or corrupt ELF,
ENOENT a missing loader or interpreter, ELIBBAD a bad loader, EACCES a permission.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass

from execwatch.binfmt import (
    BinfmtError,
    ElfInfo,
    Platform,
    Shebang,
    parse_shebang,
    read_elf,
    sniff,
)
from execwatch.binfmt.foreign import identify_file
from execwatch.diagnosis import details
from execwatch.record import Diagnosis, Reason, UndiagnosedCause
from execwatch.runnable import rules
from execwatch.runnable.fs import HEAD_BYTES
from execwatch.runnable.openat2 import NotRegularFile, Resolver, Root
from execwatch.runnable.rules import Fault, Loader

MAX_INTERPRETER_DEPTH = 4  # the kernel's BINPRM_MAX_RECURSION


@dataclass(frozen=True)
class Context:
    root: Root
    err: int


class Examiner:
    """Reads an opened file the way the kernel's binfmt handlers did."""

    def __init__(self, node: Platform, resolver: Resolver) -> None:
        self._node = node
        self._resolver = resolver

    @property
    def node_arch(self) -> str:
        return self._node.architecture

    def examine(self, ctx: Context, fd: int, path: str) -> Diagnosis:
        return self._examine(ctx, fd, path, depth=0)

    def unopened(self, ctx: Context, exc: OSError) -> Diagnosis:
        """The file the exec named could not be opened again (target.py)."""
        if isinstance(exc, FileNotFoundError):
            reason = Reason.NOT_FOUND if ctx.err == errno.ENOENT else Reason.UNDIAGNOSED
            return self.result(reason, detail="no such file", cause=UndiagnosedCause.GONE)
        if isinstance(exc, NotRegularFile):
            return self.unreadable(ctx, detail=exc.strerror or "")
        return self.unreadable(ctx, detail=f"cannot open: {exc.strerror}", denied=False)

    def unreadable(
        self, ctx: Context, *, interpreter: str | None = None, detail: str, denied: bool = True
    ) -> Diagnosis:
        """A file the exec needs that cannot be read: the kernel's EACCES explains it."""
        if denied and ctx.err == errno.EACCES:
            return self.result(Reason.PERMISSION_DENIED, interpreter=interpreter, detail=detail)
        return self.result(
            Reason.UNDIAGNOSED,
            interpreter=interpreter,
            detail=detail,
            cause=UndiagnosedCause.UNREADABLE,
        )

    def _examine(self, ctx: Context, fd: int, path: str, depth: int) -> Diagnosis:
        if ctx.err == errno.EACCES and (denied := self._permission_problem(fd)):
            return self.result(Reason.PERMISSION_DENIED, detail=denied)
        head = os.pread(fd, HEAD_BYTES, 0)
        kind = sniff(head)
        if kind == "elf":
            return self._examine_elf(ctx, fd, path)
        if kind == "shebang":
            shebang = parse_shebang(head)
            if shebang is not None:
                return self._examine_script(ctx, shebang, path, depth)
        other_os = self._foreign_os(fd, path) if ctx.err == errno.ENOEXEC else None
        if other_os is not None:
            return other_os
        if ctx.err == errno.ENOEXEC:  # benign or fatal by what its caller does next
            return self.result(Reason.NO_SHEBANG, detail=details.no_shebang(head))
        return self.result(
            Reason.UNDIAGNOSED, detail="not ELF and no #! line", cause=UndiagnosedCause.UNEXPLAINED
        )

    def _foreign_os(self, fd: int, path: str) -> Diagnosis | None:
        """Mach-O, PE or a.out: no shell retry helps, on any Linux node."""
        with os.fdopen(os.dup(fd), "rb") as f:
            other = identify_file(f)
        return None if other is None else self._word(rules.foreign_os(path, other))

    def _examine_elf(self, ctx: Context, fd: int, path: str) -> Diagnosis:
        try:
            with os.fdopen(os.dup(fd), "rb") as f:
                info = read_elf(f)
        except BinfmtError as exc:
            return self._word(rules.corrupt_binary(path, str(exc)))
        foreign = rules.foreign_architecture(path, info, self._node)
        if foreign is not None:
            return self._word(foreign)
        if info.interpreter:
            found = self._check_loader(ctx, path, info)
            if found is not None:
                return found
        if ctx.err == errno.ENOEXEC:
            return self.result(
                Reason.CORRUPT_BINARY,
                binary_arch=info.arch,
                detail="the kernel rejected an ELF of its own architecture (bad program headers?)",
            )
        return self.result(
            Reason.UNDIAGNOSED,
            binary_arch=info.arch,
            interpreter=info.interpreter,
            cause=UndiagnosedCause.UNEXPLAINED,
        )

    def _check_loader(self, ctx: Context, path: str, info: ElfInfo) -> Diagnosis | None:
        loader = self._find_loader(ctx, info.interpreter or "")
        if isinstance(loader, Diagnosis):
            return loader
        fault = rules.loader_fault(path, info, loader, image=None)
        if fault is not None:
            return self._word(fault)
        if ctx.err == errno.ELIBBAD:
            return self.result(
                Reason.BAD_INTERPRETER, interpreter=loader.path, detail="kernel rejected the loader"
            )
        return None

    def _find_loader(self, ctx: Context, loader: str) -> Loader | Diagnosis:
        """PT_INTERP in the caller's root, as the rules take it; a loader that is there but
        cannot be opened is a bad interpreter at once."""
        try:
            fd = self._resolver.open_regular(ctx.root, loader)
        except FileNotFoundError:
            return Loader(loader, False)
        except OSError as exc:
            return self.result(Reason.BAD_INTERPRETER, interpreter=loader, detail=str(exc.strerror))
        with os.fdopen(fd, "rb") as f:
            if sniff(os.pread(f.fileno(), HEAD_BYTES, 0)) != "elf":
                return Loader(loader, True, loader, problem="loader is not ELF")
            try:
                return Loader(loader, True, loader, read_elf(f))
            except BinfmtError as exc:
                return Loader(loader, True, loader, problem=str(exc))

    def _examine_script(self, ctx: Context, shebang: Shebang, path: str, depth: int) -> Diagnosis:
        interpreter = shebang.interpreter
        crlf = (
            " (the #! line ends in CR: the file has Windows line endings)" if shebang.crlf else ""
        )
        try:
            fd = self._resolver.open_regular(ctx.root, interpreter)
        except FileNotFoundError:
            missing = rules.shebang_fault(path, interpreter)
            return self._word(missing, f"the #! interpreter does not exist{crlf}")
        except OSError as exc:
            return self.unreadable(ctx, interpreter=interpreter, detail=str(exc.strerror))
        if depth >= MAX_INTERPRETER_DEPTH:
            os.close(fd)
            return self.result(
                Reason.UNDIAGNOSED,
                interpreter=interpreter,
                detail="too many #! levels",
                cause=UndiagnosedCause.UNEXPLAINED,
            )
        with os.fdopen(fd, "rb") as f:
            inner = self._examine(ctx, f.fileno(), interpreter, depth + 1)
        return Diagnosis(
            reason=inner.reason,
            node_arch=inner.node_arch,
            binary_arch=inner.binary_arch,
            interpreter=inner.interpreter or interpreter,
            detail=f"script interpreter {interpreter}: {inner.detail}",
        )

    def _permission_problem(self, fd: int) -> str | None:
        st = os.fstat(fd)
        if not st.st_mode & (stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH):
            return f"no execute permission (mode {stat.filemode(st.st_mode)})"
        if os.fstatvfs(fd).f_flag & os.ST_NOEXEC:
            return "the filesystem is mounted noexec"
        return None

    def _word(self, fault: Fault, detail: str | None = None) -> Diagnosis:
        """A fault of the rules as the node words it."""
        if detail is None:
            detail = details.exec_detail(fault, self.node_arch)
        return self.result(
            fault.reason, binary_arch=fault.arch, interpreter=fault.interpreter, detail=detail
        )

    def result(
        self,
        reason: Reason,
        *,
        binary_arch: str | None = None,
        interpreter: str | None = None,
        detail: str = "",
        cause: UndiagnosedCause | None = None,
    ) -> Diagnosis:
        if reason is not Reason.UNDIAGNOSED:
            cause = None
        return Diagnosis(reason, self.node_arch, binary_arch, interpreter, detail, cause=cause)
