"""Why did a process die right after a successful exec? The loader's rules, applied in its root.

The kernel reports an early death (execwatch.bpf: the loader called exit_group, or a
fatal signal came within the window) with the executable's path, inode and device. Here
the executable is found again in the task's root (or a stand-in with the same root) and
resolved with the scanner's linker, so `execwatch scan` and the node agree on what is
missing. An early death that nothing explains is a StartupCrash when a signal killed it
and BenignExit otherwise (a musl shell saying "command not found" exits 127 from
inside musl's loader, which is also its libc).

The checks run in ld.so's order: libraries, symbol versions, the CPU's x86-64 level
(`dl_isa_level_check`, glibc only, against this node's /proc/cpuinfo read once), then
symbols. A static or musl binary that needs a level the CPU lacks is not refused by a
loader: it dies of SIGILL at its first such instruction, which is then the explanation.
"""

from __future__ import annotations

import signal
from collections import OrderedDict
from dataclasses import dataclass

from execwatch.binfmt import (
    BinfmtError,
    ElfInfo,
    LibcFlavor,
    Platform,
    can_execute,
    libc_flavor,
    loader_flavor,
    node_platform,
)
from execwatch.binfmt.isa import Shortfall, first_shortfall, read_cpu_levels
from execwatch.diagnosis.budget import SlowFileSystem, SlowMounts
from execwatch.diagnosis.roots import RootLocator
from execwatch.diagnosis.rootview import RootView
from execwatch.record import Diagnosis, KernelEvent, Reason
from execwatch.scan.errors import ScanInputError
from execwatch.scan.fs import FileSystem, resolve
from execwatch.scan.linker import Linker, Resolution

CACHE_SIZE = 1024


@dataclass(frozen=True)
class Finding:
    reason: Reason
    detail: str
    interpreter: str | None = None
    library: str | None = None
    symbol: str | None = None
    version: str | None = None


def running_loader(fs: FileSystem, info: ElfInfo) -> tuple[str, LibcFlavor | None] | None:
    """The file behind PT_INTERP in this root, and which C library it really belongs to."""
    if info.interpreter is None:
        return None
    real = resolve(fs, info.interpreter)
    loader = fs.node(real) if real else None
    if real is None or loader is None:
        return None  # the kernel would have refused the exec: not an early death
    return real, loader_flavor(real, loader.elf)


def explain(
    fs: FileSystem, path: str, info: ElfInfo, cpu_levels: int | None = None
) -> Finding | None:
    """What the dynamic loader of this root cannot do for this executable, or None.

    `cpu_levels`: the x86-64 levels of the CPU it ran on (binfmt.isa), None if unknown."""
    found = running_loader(fs, info)
    if found is None or info.interpreter is None:
        return None
    real, actual = found
    wanted = libc_flavor(info.interpreter)
    if wanted is not None and actual is not None and wanted != actual:
        return Finding(
            Reason.LIBC_MISMATCH,
            f"a {wanted} binary run by {actual}'s loader ({info.interpreter} -> {real}),"
            " as gcompat installs it: symbols resolve against the wrong C library",
            interpreter=info.interpreter,
        )
    linker = Linker(fs, {})
    result = linker.resolve(path, info, actual or wanted or "glibc")
    if result.missing:
        miss = result.missing[0]
        by = "" if miss.needed_by == path else f" (needed by {miss.needed_by})"
        return Finding(
            Reason.MISSING_LIBRARY,
            f"{miss.name}{by}: {miss.reason}",
            interpreter=info.interpreter,
            library=miss.name,
        )
    if result.versions:
        v = result.versions[0]
        return Finding(
            Reason.MISSING_SYMBOL_VERSION,
            f"{v.library}: version `{v.version}' not found (required by {v.needed_by})",
            interpreter=info.interpreter,
            library=v.library,
            version=v.version,
        )
    if (
        (actual or wanted or "glibc") == "glibc"
        and cpu_levels is not None
        and checks_levels(result)
    ):
        objects = [(o.path, o.info.x86_isa_needed) for o in result.loaded]
        short = first_shortfall(objects, cpu_levels)
        if short is not None:
            return cpu_finding(short, path, info, "CPU ISA level is lower than required")
    for sym in linker.missing_symbols(result):
        version = f", version {sym.version}" if sym.version else ""
        return Finding(
            Reason.MISSING_SYMBOL,
            f"undefined symbol: {sym.symbol}{version}"
            + (f" (not in {sym.library})" if sym.library else ""),
            interpreter=info.interpreter,
            library=sym.library,
            symbol=sym.symbol,
            version=sym.version,
        )
    return None


def checks_levels(result: Resolution) -> bool:
    """glibc's loader checks ISA levels since 2.33, whose libc.so.6 defines GLIBC_2.33; an
    older one lets the program run into SIGILL (a program without libc: assumed new)."""
    libc = next((o for o in result.loaded if o.info.soname == "libc.so.6"), None)
    return libc is None or "GLIBC_2.33" in libc.info.version_defs


def cpu_finding(short: Shortfall, path: str, info: ElfInfo, symptom: str) -> Finding:
    lib = None if short.path == path else short.path
    return Finding(
        Reason.UNSUPPORTED_CPU,
        f"{short.path} requires {short.required}, this CPU has {short.has}: {symptom}",
        interpreter=info.interpreter,
        library=lib,
        version=short.required,
    )


class _RootGone(Exception):
    """No task, recorded root or container rootfs leads to the root any more."""


class StartupDiagnoser:
    """Diagnoses early deaths; results are cached per executable and root."""

    def __init__(
        self,
        locator: RootLocator | None = None,
        node: Platform | None = None,
        slow: SlowMounts | None = None,
    ) -> None:
        self._locator = locator or RootLocator()
        self._node = node or node_platform()
        self._slow = slow
        self._cpu_levels = (
            read_cpu_levels() if self._node.architecture in ("amd64", "386") else None
        )
        self._cache: OrderedDict[tuple[int, int, int, int, int | None, int | None], Diagnosis] = (
            OrderedDict()
        )

    def diagnose(self, event: KernelEvent) -> Diagnosis:
        key = (
            event.mntns,
            event.root_ino,
            event.exe_ino,
            event.exe_dev,
            event.exit_code,
            event.signal,
        )
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return cached
        diagnosis, settled = self._diagnose(event)
        if settled:  # a root not read this time may be readable the next
            self._cache[key] = diagnosis
        while len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)
        return diagnosis

    def _diagnose(self, event: KernelEvent) -> tuple[Diagnosis, bool]:
        """The diagnosis, and whether the root was read to reach it."""
        try:
            return self._diagnose_in_root(event), True
        except SlowFileSystem as exc:
            detail = f"not read: {exc}"
            return Diagnosis(Reason.UNDIAGNOSED, self._node.architecture, detail=detail), False
        except _RootGone:
            why = "the task is gone and no live task has its root"
            return self._unexplained(event, why), False
        except (ScanInputError, BinfmtError) as exc:  # over a budget, a symlink loop
            detail = f"not diagnosed: {exc}"
            return Diagnosis(Reason.UNDIAGNOSED, self._node.architecture, detail=detail), True

    def _diagnose_in_root(self, event: KernelEvent) -> Diagnosis:
        root = self._locator.open(event)
        if root is None:
            raise _RootGone
        try:
            fs = RootView(root, self._slow)
            st = fs.stat(event.path)
            if st is None or (
                event.exe_ino and (st.st_ino, st.st_dev) != (event.exe_ino, event.exe_dev)
            ):
                return self._unexplained(event, f"{event.path} is no longer the file that ran")
            node = fs.node(event.path)
            if node is None or node.elf is None:
                return self._unexplained(event, "not a readable ELF file")
            info = node.elf
            if info.platform is not None and not can_execute(self._node, info.platform):
                return self._unexplained(event, f"an {info.arch} binary (binfmt_misc?)")
            finding = explain(fs, event.path, info, self._cpu_levels)
            if finding is None and event.signal == signal.SIGILL:
                finding = self._illegal_instruction(event.path, info)
            loader = running_loader(fs, info)
        finally:
            root.close()
        if finding is None:
            flavor = loader[1] if loader else None
            return self._unexplained(event, "its libraries and versions resolve", flavor)
        return Diagnosis(
            finding.reason,
            self._node.architecture,
            binary_arch=info.arch,
            interpreter=finding.interpreter,
            detail=finding.detail,
            library=finding.library,
            symbol=finding.symbol,
            version=finding.version,
        )

    def _illegal_instruction(self, path: str, info: ElfInfo) -> Finding | None:
        """SIGILL from a binary that no loader checked (static, musl) and that says it
        needs a level this CPU lacks."""
        if self._cpu_levels is None:
            return None
        short = first_shortfall([(path, info.x86_isa_needed)], self._cpu_levels)
        if short is None:
            return None
        return cpu_finding(short, path, info, "no loader checks it, the CPU stops it with SIGILL")

    def _unexplained(
        self, event: KernelEvent, why: str, flavor: LibcFlavor | None = None
    ) -> Diagnosis:
        """A signal: the program's own crash. An exit: benign under musl, whose loader is
        also the libc every exit goes through; under glibc only a loader failure exits
        from ld.so, so it is reported, undiagnosed. So is an exit whose binary was not
        read (a dead container's rootfs already unmounted): never a silent all clear."""
        arch = self._node.architecture
        if event.signal is not None:
            detail = f"{event.status} {event.age_ms or 0:.0f} ms after it started; {why}"
            return Diagnosis(Reason.STARTUP_CRASH, arch, detail=detail)
        detail = f"exit {event.exit_code} from inside the ELF loader; {why}"
        if flavor == "musl":
            return Diagnosis(Reason.BENIGN_EXIT, arch, detail=detail)
        return Diagnosis(Reason.UNDIAGNOSED, arch, detail=detail)
