"""Why did a process die right after a successful exec? The loader's rules, applied in its root.

The kernel reports an early death (execwatch.bpf: the loader called exit_group, or a
fatal signal came within the window) with the executable's path, inode and device. Here
the executable is found again in the task's root (or a stand-in with the same root) and
judged by the rules `execwatch scan` applies (execwatch.runnable.rules), so the scan and
the node agree on what is missing. An early death that nothing explains is a StartupCrash
when a signal killed it and BenignExit otherwise (a musl shell saying "command not found"
exits 127 from inside musl's loader, which is also its libc).

The checks run in ld.so's order: libraries, symbol versions, the CPU's x86-64 level
(`dl_isa_level_check`, glibc only, against this node's /proc/cpuinfo read once), then
symbols. A static or musl binary that needs a level the CPU lacks is not refused by a
loader: it dies of SIGILL at its first such instruction, which is then the explanation.
"""

from __future__ import annotations

import signal
import time
from dataclasses import replace

from cachetools import TTLCache

from execwatch.binfmt import BinfmtError, ElfInfo, LibcFlavor, Platform, node_platform
from execwatch.binfmt.isa import read_cpu_levels
from execwatch.diagnosis import details
from execwatch.diagnosis.budget import SlowFileSystem, SlowMounts
from execwatch.diagnosis.roots import RootLocator
from execwatch.record import Diagnosis, EarlyDeath, Reason, UndiagnosedCause, undiagnosed
from execwatch.runnable import rules
from execwatch.runnable.errors import InputError
from execwatch.runnable.fs import FileSystem
from execwatch.runnable.liveroot import RootView
from execwatch.runnable.rules import Fault

CACHE_SIZE = 1024
# A diagnosis is reused this long: enough to absorb a crash loop with no back-off, never a
# user's retry after fixing one library and missing the next.
CACHE_TTL_S = 2.0


def explain(
    fs: FileSystem, path: str, info: ElfInfo, cpu_levels: int | None = None
) -> Fault | None:
    """The fault the dynamic loader of this root stops at first for this executable, or
    None, worded as the node reports it. `cpu_levels`: the x86-64 levels (binfmt.isa) of
    the CPU it ran on, None if unknown."""
    faults = rules.startup_faults(fs, path, info, cpu_levels)
    return details.startup_fault(faults[0]) if faults else None


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
        self._cache: TTLCache[tuple[int, int, int, int, int | None, int | None], Diagnosis] = (
            TTLCache(CACHE_SIZE, CACHE_TTL_S, timer=time.monotonic)
        )

    def diagnose(self, event: EarlyDeath) -> Diagnosis:
        key = (
            event.mntns,
            event.root_ino,
            event.exe_ino,
            event.exe_dev,
            event.exit_code,
            event.signal,
        )
        cached = self._cache.get(key)  # a hit (younger than CACHE_TTL_S): now the newest
        if cached is not None:
            return cached
        diagnosis, settled = self._diagnose(event)
        if settled:  # a root not read this time may be readable the next
            self._cache[key] = diagnosis
        return diagnosis

    def _diagnose(self, event: EarlyDeath) -> tuple[Diagnosis, bool]:
        """The diagnosis, and whether the root was read to reach it."""
        try:
            return self._diagnose_in_root(event), True
        except SlowFileSystem as exc:
            detail = f"not read: {exc}"
            return undiagnosed(UndiagnosedCause.SLOW_MOUNT, detail, self._node.architecture), False
        except _RootGone:
            why = "the task is gone and no live task has its root"
            return self._unexplained(event, why, cause=UndiagnosedCause.GONE), False
        except (InputError, BinfmtError) as exc:  # over a budget, a symlink loop
            detail = f"not diagnosed: {exc}"
            return undiagnosed(UndiagnosedCause.UNREADABLE, detail, self._node.architecture), True

    def _diagnose_in_root(self, event: EarlyDeath) -> Diagnosis:
        root = self._locator.open(event)
        if root is None:
            raise _RootGone
        try:
            fs = RootView(root, self._slow)
            st = fs.stat(event.path)
            if st is None or (
                event.exe_ino and (st.st_ino, st.st_dev) != (event.exe_ino, event.exe_dev)
            ):
                why = f"{event.path} is no longer the file that ran"
                return self._unexplained(event, why, cause=UndiagnosedCause.GONE)
            node = fs.node(event.path)
            if node is None or node.elf is None:
                return self._unexplained(
                    event, "not a readable ELF file", cause=UndiagnosedCause.UNREADABLE
                )
            info = node.elf
            if info.platform is not None and not rules.runs_on(self._node, info):
                return self._unexplained(event, f"an {info.arch} binary (binfmt_misc?)")
            finding = explain(fs, event.path, info, self._cpu_levels)
            if finding is None and event.signal == signal.SIGILL:
                finding = self._illegal_instruction(event.path, info)
            loader = rules.find_loader(fs, info.interpreter) if info.interpreter else None
        finally:
            root.close()
        if finding is None:
            flavor = loader.flavor() if loader else None
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

    def _illegal_instruction(self, path: str, info: ElfInfo) -> Fault | None:
        """SIGILL from a binary that no loader checked (static, musl) and that says it
        needs a level this CPU lacks."""
        fault = rules.cpu_fault(path, [(path, info.x86_isa_needed)], self._cpu_levels)
        if fault is None:
            return None
        return replace(details.sigill(fault), interpreter=info.interpreter)

    def _unexplained(
        self,
        event: EarlyDeath,
        why: str,
        flavor: LibcFlavor | None = None,
        *,
        cause: UndiagnosedCause = UndiagnosedCause.UNEXPLAINED,
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
        return undiagnosed(cause, detail, arch)
