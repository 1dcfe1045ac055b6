"""The rules of "will this binary start here", applied over any FileSystem view.

Each rule returns Faults in the one vocabulary, Reason, with the facts behind them. Their
order is the kernel's, then ld.so's: the ELF itself, its PT_INTERP, the C library the
loader belongs to, its libraries, their symbol versions, the CPU's x86-64 level, its
symbols; for a `#!` script, its interpreter. The node's diagnosis picks the fault that
explains the errno or exit it saw; `execwatch scan` reports them all, each with a
severity and its own wording.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from execwatch.binfmt import (
    GLIBC_LOADERS,
    ElfInfo,
    LibcFlavor,
    Platform,
    can_execute,
    libc_flavor,
    loader_flavor,
)
from execwatch.binfmt.foreign import ForeignBinary, of_elf
from execwatch.binfmt.isa import first_shortfall
from execwatch.binfmt.shebang import missing_shebang_cause
from execwatch.runnable.fs import FileSystem, resolve
from execwatch.runnable.linker import Linker, Resolution
from execwatch.runnable.reason import Reason

GCOMPAT_LIBS = ("/lib/libgcompat.so.0", "/usr/lib/libgcompat.so.0")


@dataclass(frozen=True)
class Fault:
    """One reason a binary would not start, and the facts each reader words its own way."""

    reason: Reason
    path: str  # the executable (or script) it is about
    detail: str = ""  # the wording the scan and the node share, where they share one
    arch: str | None = None  # the offending ELF's architecture (the binary's or its loader's)
    interpreter: str | None = None
    library: str | None = None
    symbol: str | None = None
    version: str | None = None  # a symbol version (GLIBC_2.38) or an ISA level (x86-64-v3)


@dataclass(frozen=True)
class Loader:
    """What PT_INTERP names, as found in the root (`elf` None: absent or not usable ELF)."""

    path: str  # PT_INTERP as written
    present: bool
    real: str | None = None  # the file it resolves to
    elf: ElfInfo | None = None
    problem: str = ""  # why a present loader is not usable ELF (for the node's detail)

    def flavor(self) -> LibcFlavor | None:
        """Which C library the loader really belongs to (gcompat links glibc's to musl's)."""
        return loader_flavor(self.real, self.elf) if self.real else None


def not_found(path: str) -> Fault:
    """The program named does not exist: its exec fails ENOENT."""
    return Fault(Reason.NOT_FOUND, path)


def corrupt_binary(path: str, error: str) -> Fault:
    """It starts like an ELF but its headers cannot be read."""
    return Fault(Reason.CORRUPT_BINARY, path, error)


def runs_on(platform: Platform, info: ElfInfo) -> bool:
    return info.platform is not None and can_execute(platform, info.platform)


def foreign_architecture(path: str, info: ElfInfo, platform: Platform) -> Fault | None:
    """binfmt_elf refuses an ELF of another machine, class, byte order or ABI (ENOEXEC); an
    ELF of another OS is named as such (a BSD's loader or system calls Linux lacks)."""
    if runs_on(platform, info):
        return None
    other = of_elf(info)
    if other is not None and platform.os == "linux":
        return foreign_os(path, other)
    return Fault(Reason.FOREIGN_ARCHITECTURE, path, arch=info.arch)


def foreign_os(path: str, binary: ForeignBinary) -> Fault:
    """An executable of another OS: Mach-O, PE and a.out are refused (ENOEXEC) on every
    Linux node, whatever its architecture."""
    return Fault(Reason.FOREIGN_OS, path, binary.detail(), arch=binary.arch)


def missing_shebang(path: str, head: bytes) -> Fault:
    """Neither ELF nor `#!`, started by a caller that does not retry it with /bin/sh (a
    container runtime's init): ENOEXEC on every node. The detail names the likely cause."""
    return Fault(Reason.MISSING_SHEBANG, path, missing_shebang_cause(head))


def find_loader(fs: FileSystem, interpreter: str) -> Loader:
    real = resolve(fs, interpreter)
    node = fs.node(real) if real else None
    if node is None or node.kind != "file":
        return Loader(interpreter, False)
    return Loader(interpreter, True, real, node.elf, "" if node.elf else "loader is not ELF")


def loader_fault(
    path: str, info: ElfInfo, loader: Loader, image: LibcFlavor | None
) -> Fault | None:
    """PT_INTERP absent (ENOENT), or not an ELF of the binary's own ABI (ELIBBAD). `image`:
    the root's C library, when known: an absent loader of the other one is still a missing
    interpreter (the kernel's ENOENT, exit 127), its detail naming the two C libraries."""
    interp = loader.path
    if not loader.present:
        wanted = libc_flavor(interp)
        other = wanted is not None and image is not None and wanted != image
        detail = f"a {wanted} binary in a {image} image" if other else ""
        return Fault(Reason.MISSING_INTERPRETER, path, detail, interpreter=interp)
    if loader.elf is None:
        return Fault(Reason.BAD_INTERPRETER, path, loader.problem, interpreter=interp)
    if not info.same_abi(loader.elf):
        return Fault(Reason.BAD_INTERPRETER, path, interpreter=interp, arch=loader.elf.arch)
    return None


def libc_fault(path: str, loader: Loader) -> Fault | None:
    """A binary of one C library run by the other's loader (gcompat installs musl's as
    glibc's): it starts, and its symbols resolve against the wrong C library."""
    wanted, actual = libc_flavor(loader.path), loader.flavor()
    if wanted is None or actual is None or wanted == actual:
        return None
    detail = f"a {wanted} binary run by {actual}'s loader ({loader.path} -> {loader.real})"
    return Fault(Reason.LIBC_MISMATCH, path, detail, interpreter=loader.path)


def shebang_fault(path: str, interpreter: str) -> Fault:
    """The `#!` interpreter is absent: ENOENT, whatever the script itself holds."""
    return Fault(Reason.MISSING_SHEBANG_INTERPRETER, path, interpreter=interpreter)


def library_faults(resolution: Resolution, path: str, interpreter: str | None) -> list[Fault]:
    """What ld.so stops at, in its order: a library it cannot find (or a search that
    stopped), then a symbol version a loaded library lacks."""
    faults = []
    for miss in resolution.missing:
        by = "" if miss.needed_by == path else f" (needed by {miss.needed_by})"
        faults.append(
            Fault(
                Reason.MISSING_LIBRARY,
                path,
                f"{miss.name}{by}: {miss.reason}",
                interpreter=interpreter,
                library=miss.name,
            )
        )
    if resolution.incomplete:  # the libraries after these were never searched
        detail = f"library search stopped, more may be missing: {resolution.incomplete}"
        faults.append(Fault(Reason.MISSING_LIBRARY, path, detail, interpreter=interpreter))
    for v in resolution.versions:
        detail = f"{v.library}: version `{v.version}' not found (required by {v.needed_by})"
        faults.append(
            Fault(
                Reason.MISSING_SYMBOL_VERSION,
                path,
                detail,
                interpreter=interpreter,
                library=v.library,
                version=v.version,
            )
        )
    return faults


def symbol_faults(linker: Linker, resolution: Resolution, path: str) -> list[Fault]:
    """Imports no loaded object exports (symbol lookup error): empty when unknown."""
    faults = []
    for sym in linker.missing_symbols(resolution):
        version = f", version {sym.version}" if sym.version else ""
        faults.append(
            Fault(
                Reason.MISSING_SYMBOL,
                path,
                f"undefined symbol: {sym.symbol}{version}",
                library=sym.library,
                symbol=sym.symbol,
                version=sym.version,
            )
        )
    return faults


def cpu_fault(path: str, objects: list[tuple[str, int]], levels: int | None) -> Fault | None:
    """An object that needs an x86-64 level `levels` (binfmt.isa bits) lacks."""
    short = None if levels is None else first_shortfall(objects, levels)
    if short is None:
        return None
    lib = None if short.path == path else short.path
    detail = f"{short.path} requires {short.required}, this CPU has {short.has}"
    return Fault(Reason.UNSUPPORTED_CPU, path, detail, library=lib, version=short.required)


def loader_checks_levels(resolution: Resolution) -> bool:
    """glibc's loader checks ISA levels since 2.33, whose libc.so.6 defines GLIBC_2.33; an
    older one lets the program run into SIGILL (a program without libc: assumed new)."""
    libc = next((o for o in resolution.loaded if o.info.soname == "libc.so.6"), None)
    return libc is None or "GLIBC_2.33" in libc.info.version_defs


def startup_faults(
    fs: FileSystem, path: str, info: ElfInfo, cpu_levels: int | None = None
) -> list[Fault]:
    """What the dynamic loader of this root cannot do for this executable, in the order it
    would stop at them. `cpu_levels`: the CPU's x86-64 levels (binfmt.isa), None if unknown."""
    if info.interpreter is None:
        return []
    loader = find_loader(fs, info.interpreter)
    if not loader.present:
        return []  # the kernel would have refused the exec: not an early death
    mismatch = libc_fault(path, loader)
    if mismatch is not None:
        return [mismatch]
    flavor = loader.flavor() or libc_flavor(info.interpreter) or "glibc"
    linker = Linker(fs, {})
    resolution = linker.resolve(path, info, flavor)
    faults = library_faults(resolution, path, info.interpreter)
    if not faults and flavor == "glibc" and loader_checks_levels(resolution):
        objects = [(o.path, o.info.x86_isa_needed) for o in resolution.loaded]
        faults = [f for f in [cpu_fault(path, objects, cpu_levels)] if f is not None]
    if not faults:  # symbols are read only when nothing earlier stops ld.so
        faults = symbol_faults(linker, resolution, path)
    return [replace(f, interpreter=info.interpreter) for f in faults]


def image_libc(fs: FileSystem) -> LibcFlavor | None:
    """The root's C library, when it has one only: glibc's loader, or musl's (a musl root
    with gcompat has a glibc loader name that is musl's)."""
    musl = any(
        real is not None and any(n.startswith("ld-musl-") for n in fs.listdir(real))
        for real in (resolve(fs, d) for d in ("/lib", "/usr/lib"))
    )
    gcompat = any(resolve(fs, p) for p in GCOMPAT_LIBS)
    glibc = any(resolve(fs, p) for p in set(GLIBC_LOADERS.values())) and not (musl and gcompat)
    if musl and not glibc:
        return "musl"
    if glibc and not musl:
        return "glibc"
    return None
