"""Classifying a failed exec by reading the file the kernel refused, as the task saw it.

The errno says what the kernel concluded; the file says why. ELF and shebang knowledge
comes from execwatch.binfmt, the same module the image scanner uses.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from execwatch.binfmt import (
    BinfmtError,
    Platform,
    Shebang,
    can_execute,
    node_platform,
    parse_shebang,
    read_elf,
    sniff,
)
from execwatch.diagnosis.budget import SlowFileSystem, SlowMounts
from execwatch.diagnosis.confined import NotRegularFile, Resolver, Root, reopen_regular
from execwatch.diagnosis.container_rootfs import ContainerRootfs
from execwatch.diagnosis.roots import RootLocator
from execwatch.diagnosis.startup import StartupDiagnoser
from execwatch.record import Diagnosis, KernelEvent, Reason

HEAD_BYTES = 512  # the kernel reads 256 for #! (Linux 5.1+) and 64 for the ELF header
MAX_INTERPRETER_DEPTH = 4  # the kernel's BINPRM_MAX_RECURSION


@dataclass(frozen=True)
class _Context:
    root: Root
    err: int


class ContainerIds(Protocol):
    """What the diagnosis needs from attribution: the container a cgroup belongs to."""

    def container_id(
        self, cgroup_id: int, pid: int | None = None, *, name: str = "", parent_id: int = 0
    ) -> str | None: ...


class FileDiagnoser:
    @classmethod
    def for_host(
        cls, containers: ContainerIds | None, slow: SlowMounts | None = None
    ) -> FileDiagnoser:
        """Also looks at a dead container's rootfs, found from its id, when no task is left."""
        if containers is None:
            return cls(slow=slow)
        rootfs = ContainerRootfs()

        def container_rootfs(event: KernelEvent) -> Iterator[Path]:
            container_id = event.container_id
            if container_id is None:
                container_id = _container_of(containers, event)
            return rootfs.candidates(container_id or None, parent=event.ppid)

        made = cls(RootLocator(extra=[container_rootfs]), slow=slow)
        made._containers = containers
        return made

    def prepare(self, event: KernelEvent) -> KernelEvent:
        """In the agent, before a diagnosis worker takes the event: what only the agent's
        live state knows (the container of the cgroup, from the attribution inventory), and
        the caller's root, opened now (`root_fd`, the caller's to close): a dying task or
        container is gone within milliseconds, and the open fd pins its file system."""
        if self._containers is not None and event.container_id is None:
            container = _container_of(self._containers, event) or ""
            event = dataclasses.replace(event, container_id=container)
        root = self._locator.open(event)
        if root is None:
            return event
        return dataclasses.replace(event, root_fd=root.fd, root_description=root.description)

    def __init__(
        self,
        locator: RootLocator | None = None,
        node: Platform | None = None,
        slow: SlowMounts | None = None,
    ) -> None:
        self._locator = locator or RootLocator()
        self._node = node or node_platform()
        self._slow = slow
        self._resolver = Resolver(slow)
        self._startup = StartupDiagnoser(self._locator, self._node, slow)
        self._containers: ContainerIds | None = None

    @property
    def node_arch(self) -> str:
        return self._node.architecture

    def diagnose(self, event: KernelEvent) -> Diagnosis:
        if event.early_death:
            return self._startup.diagnose(event)
        root = self._locator.open(event)
        if root is None:
            return self._result(
                Reason.UNDIAGNOSED,
                detail="the task is gone and no live task or rootfs has its root",
            )
        try:
            return self._diagnose_in(_Context(root, event.errno), event)
        except SlowFileSystem as exc:
            return self._result(Reason.UNDIAGNOSED, detail=f"not waited for: {exc}")
        finally:
            root.close()

    def _diagnose_in(self, ctx: _Context, event: KernelEvent) -> Diagnosis:
        try:
            fd = self._open_target(ctx.root, event)
        except FileNotFoundError:
            reason = Reason.NOT_FOUND if ctx.err == errno.ENOENT else Reason.UNDIAGNOSED
            return self._result(reason, detail="no such file")
        except NotRegularFile as exc:
            return self._result(self._unreadable_reason(ctx), detail=exc.strerror or "")
        except OSError as exc:
            return self._result(Reason.UNDIAGNOSED, detail=f"cannot open: {exc.strerror}")
        with os.fdopen(fd, "rb") as f:
            return self._examine(ctx, f.fileno(), depth=0)

    def _open_target(self, root: Root, event: KernelEvent) -> int:
        if event.via_fd:  # fexecve: the caller's fd is the file
            return self._open_fd_target(root, event)
        path = self._locator.absolute(event, event.path)
        if path is None:
            raise OSError(
                errno.ENOENT, "relative path and the working directory is gone", event.path
            )
        return self._resolver.open_regular(root, path)

    def _open_fd_target(self, root: Root, event: KernelEvent) -> int:
        """Through the caller's fd while it lives and still holds the file the kernel
        recorded (device and inode: the pid may have been reused); then by the path inside
        its root that the kernel recorded, if that is still the very same file."""
        try:
            path_fd = os.open(f"/proc/{event.tgid}/fd/{event.dirfd}", os.O_PATH)
        except OSError:
            path_fd = -1
        if path_fd >= 0 and not _same_file(path_fd, event):
            os.close(path_fd)  # another process's fd under a reused pid
            path_fd = -1
        if path_fd < 0:
            if event.base_path is None:
                raise FileNotFoundError(errno.ENOENT, "the caller's fd is gone", event.path)
            path_fd = self._resolver.lookup(root, event.base_path)
            if not _same_file(path_fd, event):
                os.close(path_fd)
                raise FileNotFoundError(errno.ENOENT, "the fd's file was replaced", event.base_path)
        return reopen_regular(path_fd, event.path, self._slow)

    def _unreadable_reason(self, ctx: _Context) -> Reason:
        return Reason.PERMISSION_DENIED if ctx.err == errno.EACCES else Reason.UNDIAGNOSED

    def _examine(self, ctx: _Context, fd: int, depth: int) -> Diagnosis:
        if ctx.err == errno.EACCES and (denied := self._permission_problem(fd)):
            return self._result(Reason.PERMISSION_DENIED, detail=denied)
        head = os.pread(fd, HEAD_BYTES, 0)
        kind = sniff(head)
        if kind == "elf":
            return self._examine_elf(ctx, fd)
        if kind == "shebang":
            shebang = parse_shebang(head)
            if shebang is not None:
                return self._examine_script(ctx, shebang, depth)
        if ctx.err == errno.ENOEXEC:
            return self._result(
                Reason.NO_SHEBANG,
                detail="neither ELF nor #!: shells and execvp() retry such files with /bin/sh",
            )
        return self._result(Reason.UNDIAGNOSED, detail="not ELF and no #! line")

    def _examine_elf(self, ctx: _Context, fd: int) -> Diagnosis:
        try:
            with os.fdopen(os.dup(fd), "rb") as f:
                info = read_elf(f)
        except BinfmtError as exc:
            return self._result(Reason.CORRUPT_BINARY, detail=str(exc))
        if info.platform is None or not can_execute(self._node, info.platform):
            return self._result(
                Reason.FOREIGN_ARCHITECTURE,
                binary_arch=info.arch,
                detail=f"an {info.arch} binary cannot run on this {self.node_arch} node",
            )
        if info.interpreter:
            found = self._check_loader(ctx, info.interpreter)
            if found is not None:
                return found
        if ctx.err == errno.ENOEXEC:
            return self._result(
                Reason.CORRUPT_BINARY,
                binary_arch=info.arch,
                detail="the kernel rejected an ELF of its own architecture (bad program headers?)",
            )
        return self._result(Reason.UNDIAGNOSED, binary_arch=info.arch, interpreter=info.interpreter)

    def _check_loader(self, ctx: _Context, loader: str) -> Diagnosis | None:
        try:
            fd = self._resolver.open_regular(ctx.root, loader)
        except FileNotFoundError:
            return self._result(
                Reason.MISSING_INTERPRETER,
                interpreter=loader,
                detail=f"the ELF loader {loader} does not exist in this root filesystem "
                "(e.g. a glibc binary in a musl image)",
            )
        except OSError as exc:
            return self._result(
                Reason.BAD_INTERPRETER, interpreter=loader, detail=str(exc.strerror)
            )
        with os.fdopen(fd, "rb") as f:
            if sniff(os.pread(f.fileno(), HEAD_BYTES, 0)) != "elf":
                return self._result(
                    Reason.BAD_INTERPRETER, interpreter=loader, detail="loader is not ELF"
                )
            try:
                info = read_elf(f)
            except BinfmtError as exc:
                return self._result(Reason.BAD_INTERPRETER, interpreter=loader, detail=str(exc))
        if info.platform is None or not can_execute(self._node, info.platform):
            return self._result(
                Reason.BAD_INTERPRETER,
                interpreter=loader,
                binary_arch=info.arch,
                detail=f"the loader is an {info.arch} binary",
            )
        if ctx.err == errno.ELIBBAD:
            return self._result(
                Reason.BAD_INTERPRETER, interpreter=loader, detail="kernel rejected the loader"
            )
        return None

    def _examine_script(self, ctx: _Context, shebang: Shebang, depth: int) -> Diagnosis:
        interpreter = shebang.interpreter
        crlf = (
            " (the #! line ends in CR: the file has Windows line endings)" if shebang.crlf else ""
        )
        try:
            fd = self._resolver.open_regular(ctx.root, interpreter)
        except FileNotFoundError:
            return self._result(
                Reason.MISSING_SHEBANG_INTERPRETER,
                interpreter=interpreter,
                detail=f"the #! interpreter does not exist{crlf}",
            )
        except OSError as exc:
            return self._result(
                self._unreadable_reason(ctx), interpreter=interpreter, detail=str(exc.strerror)
            )
        if depth >= MAX_INTERPRETER_DEPTH:
            os.close(fd)
            return self._result(
                Reason.UNDIAGNOSED, interpreter=interpreter, detail="too many #! levels"
            )
        with os.fdopen(fd, "rb") as f:
            inner = self._examine(ctx, f.fileno(), depth + 1)
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

    def _result(
        self,
        reason: Reason,
        *,
        binary_arch: str | None = None,
        interpreter: str | None = None,
        detail: str = "",
    ) -> Diagnosis:
        return Diagnosis(reason, self.node_arch, binary_arch, interpreter, detail)


def _container_of(containers: ContainerIds, event: KernelEvent) -> str | None:
    return containers.container_id(
        event.cgroup_id, event.tgid, name=event.cgroup_name, parent_id=event.cgroup_parent_id
    )


def _same_file(fd: int, event: KernelEvent) -> bool:
    """The fd is the file the kernel recorded for fexecve (when it recorded one)."""
    if not event.base_ino:
        return True
    st = os.fstat(fd)
    return (st.st_ino, st.st_dev) == (event.base_ino, event.base_dev)
