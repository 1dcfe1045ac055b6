"""How the scan words the rules' faults: each message says what the kernel or the loader
will do with the file (the node words the same faults in diagnosis/examine.py)."""

from __future__ import annotations

from execwatch.binfmt import ElfInfo, libc_flavor
from execwatch.binfmt.isa import level_name
from execwatch.runnable.reason import Reason
from execwatch.runnable.rules import Fault, Loader


def platform_of(info: ElfInfo) -> str:
    return str(info.platform) if info.platform else info.arch


def foreign(info: ElfInfo, platform: str) -> str:
    return f"ELF for {platform_of(info)} cannot run on {platform} (exec format error)"


def foreign_os(fault: Fault) -> str:
    """Mach-O, PE, a.out or a BSD's ELF: no Linux node runs it, whatever its architecture."""
    return f"{fault.detail} (it runs on no Linux node, of any architecture)"


def missing_shebang(fault: Fault) -> str:
    """The program a container starts is neither ELF nor `#!`: the runtime does not retry."""
    return (
        "neither ELF nor a #! script: the container runtime's exec fails (exec format"
        f" error) on every node; {fault.detail}"
    )


def cpu_refused(fault: Fault, levels: int) -> str:
    """The nodes' level is stated (--cpu-level, amd64/vN) and below what it needs."""
    return (
        f"needs {fault.version}{_which(fault)}, the nodes have {level_name(levels)}:"
        " glibc's loader refuses it (CPU ISA level is lower than required, exit 127),"
        " other loaders let it die of SIGILL"
    )


def cpu_unpromised(fault: Fault, platform: str) -> str:
    """Plain amd64 promises only the baseline."""
    return (
        f"needs {fault.version}{_which(fault)}, but {platform} promises only"
        " x86-64-baseline CPUs (state the nodes' level with --cpu-level or an amd64/vN"
        " platform)"
    )


def _which(fault: Fault) -> str:
    return "" if fault.library is None else f" ({fault.library})"


def loader_problem(fault: Fault, loader: Loader) -> str:
    interp = loader.path
    if fault.reason is Reason.MISSING_INTERPRETER:
        why = f": {fault.detail}" if fault.detail else ""
        return (
            f"ELF interpreter {interp} not found in the image{why}"
            " (no such file or directory, exit 127)"
        )
    what = "not an ELF file" if loader.elf is None else f"ELF for {loader.elf.arch}"
    return f"ELF interpreter {interp} is {what} (accessing a corrupted shared library)"


def libc_mismatch(loader: Loader) -> str:
    if libc_flavor(loader.path) == "glibc":
        return (
            "glibc binary on a musl image through gcompat: symbol versions are not"
            " checked and it can crash at run time (SIGSEGV, exit 139)"
        )
    wanted, actual = libc_flavor(loader.path), loader.flavor()
    return f"{wanted} binary run by {actual}'s loader: it can crash at run time"
