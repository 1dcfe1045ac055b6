"""The checks: will each executable of a filesystem start on a platform?

Executables are regular files with an execute bit that are ELF programs or `#!` scripts.
The image's entrypoint/cmd program (and its `#!` interpreter) is checked first and its
findings are marked, because its failure crash-loops the pod.
"""

from __future__ import annotations

import posixpath
import shlex
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from execwatch.binfmt import (
    GLIBC_LOADERS,
    ElfInfo,
    LibcFlavor,
    Platform,
    can_execute,
    libc_flavor,
    parse_shebang,
    sniff,
)
from execwatch.binfmt.isa import first_shortfall, level_name, platform_levels
from execwatch.scan.fs import FileSystem, Node, resolve
from execwatch.scan.linker import Linker
from execwatch.scan.model import Check, Finding, Severity, Stats

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
GCOMPAT_LIBS = ("/lib/libgcompat.so.0", "/usr/lib/libgcompat.so.0")


@dataclass
class Target:
    """What to check and against what."""

    fs: FileSystem
    platform: Platform
    env: dict[str, str] = field(default_factory=dict)
    entrypoint: list[str] | None = None
    workdir: str = "/"
    config_platform: Platform | None = None
    isolated: bool = False  # a lone file: nothing to resolve its loader or libraries against
    require_static: bool = False
    cpu_levels: int | None = None  # --cpu-level: the x86-64 levels (binfmt.isa) of the nodes


@dataclass(frozen=True)
class ImageLibc:
    glibc: bool
    musl: bool
    gcompat: bool

    @classmethod
    def detect(cls, fs: FileSystem) -> ImageLibc:
        glibc = any(resolve(fs, p) for p in set(GLIBC_LOADERS.values()))
        musl = False
        for d in ("/lib", "/usr/lib"):
            real = resolve(fs, d)
            if real and any(n.startswith("ld-musl-") for n in fs.listdir(real)):
                musl = True
        gcompat = any(resolve(fs, p) for p in GCOMPAT_LIBS)
        return cls(glibc and not (musl and gcompat), musl, musl and gcompat)

    def flavor(self) -> LibcFlavor | None:
        if self.musl and not self.glibc:
            return "musl"
        if self.glibc and not self.musl:
            return "glibc"
        return None


Progress = Callable[[int], None]


class Checker:
    def __init__(self, target: Target) -> None:
        self.t = target
        self.platform = str(target.platform)
        self.linker = Linker(target.fs, target.env)
        self.libc = (
            ImageLibc.detect(target.fs) if not target.isolated else ImageLibc(False, False, False)
        )
        self.findings: list[Finding] = []
        self.checked: set[str] = set()
        self.stats = Stats()
        self.binary_platforms: Counter[str] = Counter()
        self.path = [
            d for d in target.env.get("PATH", DEFAULT_PATH).split(":") if d.startswith("/")
        ]

    def run(self, progress: Progress | None = None) -> tuple[list[Finding], Stats]:
        started = time.perf_counter()
        if self.t.entrypoint:
            self._check_entrypoint(self.t.entrypoint)
        for path, mode in self.t.fs.files():
            self.stats.files += 1
            if progress is not None:
                progress(1)
            if path in self.checked or not mode & 0o111:
                continue
            node = self.t.fs.node(path)
            if node is not None and node.executable:
                self._check_file(path, node, entry=False)
        self._check_config_platform()
        self.stats.seconds = time.perf_counter() - started
        return self.findings, self.stats

    def add(self, check: Check, severity: Severity, path: str, message: str, entry: bool) -> None:
        self.findings.append(Finding(check, severity, path, self.platform, message, entry))

    # --- entrypoint -------------------------------------------------------------------------

    def _check_entrypoint(self, argv: list[str]) -> None:
        program = argv[0]
        candidates = (
            [posixpath.join(self.t.workdir, program)]
            if "/" in program
            else [posixpath.join(d, program) for d in self.path]
        )
        for candidate in candidates:
            real = resolve(self.t.fs, candidate)
            node = self.t.fs.node(real) if real else None
            if real and node is not None and node.kind == "file" and node.executable:
                self._check_file(real, node, entry=True)
                return
        where = "" if "/" in program else f" on PATH {':'.join(self.path)}"
        self.add(
            Check.MISSING_ENTRYPOINT,
            Severity.ERROR,
            program,
            f"entrypoint program {program!r} not found{where}",
            entry=True,
        )

    # --- one executable ---------------------------------------------------------------------

    def _check_file(self, path: str, node: Node, entry: bool) -> None:
        if path in self.checked:
            return
        self.checked.add(path)
        kind = sniff(node.head)
        if kind == "elf":
            self._check_elf(path, node, entry)
        elif kind == "shebang":
            self.stats.scripts += 1
            self.stats.executables += 1
            self._check_script(path, node, entry)

    def _check_elf(self, path: str, node: Node, entry: bool) -> None:
        self.stats.elf += 1
        if node.elf is None:
            self.stats.executables += 1
            self.add(
                Check.CORRUPT_BINARY,
                Severity.ERROR,
                path,
                f"malformed ELF: {node.elf_error}",
                entry,
            )
            return
        info = node.elf
        if not info.is_executable:
            return  # a shared library with an execute bit: checked through its users
        self.stats.executables += 1
        self.binary_platforms[str(info.platform) if info.platform else info.arch] += 1
        if info.platform is None or not can_execute(self.t.platform, info.platform):
            self.add(
                Check.ARCH_MISMATCH,
                Severity.ERROR,
                path,
                f"ELF for {_describe(info)} cannot run on {self.platform} (exec format error)",
                entry,
            )
            return
        if self.t.require_static and not info.is_static:
            how = f"loader {info.interpreter}" if info.interpreter else "DT_NEEDED libraries"
            self.add(
                Check.NOT_STATIC,
                Severity.ERROR,
                path,
                f"dynamically linked ({how}); --require-static",
                entry,
            )
        if self.t.isolated or info.is_static:
            self._check_cpu(path, [(path, info.x86_isa_needed)], entry)
            return
        flavor = self._loader_check(path, info, entry)
        if flavor is None:
            return
        result = self.linker.resolve(path, info, flavor)
        self._check_cpu(path, [(o.path, o.info.x86_isa_needed) for o in result.loaded], entry)
        for miss in result.missing:
            by = "" if miss.needed_by == path else f" (needed by {miss.needed_by})"
            self.add(
                Check.MISSING_LIBRARY,
                Severity.ERROR,
                path,
                f"{miss.name}{by}: {miss.reason}",
                entry,
            )
        if result.incomplete:  # the libraries after these were never searched
            message = f"library search stopped, more may be missing: {result.incomplete}"
            self.add(Check.MISSING_LIBRARY, Severity.ERROR, path, message, entry)
        for v in result.versions:
            self.add(
                Check.MISSING_SYMBOL_VERSION,
                Severity.ERROR,
                path,
                f"{v.library}: version `{v.version}' not found (required by {v.needed_by})",
                entry,
            )
        if result.missing or result.versions:
            return
        for sym in self.linker.missing_symbols(result):
            version = f", version {sym.version}" if sym.version else ""
            self.add(
                Check.MISSING_SYMBOL,
                Severity.ERROR,
                path,
                f"undefined symbol: {sym.symbol}{version} (symbol lookup error, exit 127)",
                entry,
            )

    def _check_cpu(self, path: str, objects: list[tuple[str, int]], entry: bool) -> None:
        """An x86-64 level the nodes lack: --cpu-level, else the platform's amd64 variant
        (an error), else plain amd64, which promises only the baseline (a warning)."""
        stated = self.t.cpu_levels is not None or self.t.platform.variant is not None
        levels = self.t.cpu_levels
        if levels is None:
            levels = platform_levels(self.t.platform)
        short = None if levels is None else first_shortfall(objects, levels)
        if short is None or levels is None:
            return
        which = "" if short.path == path else f" ({short.path})"
        if stated:
            message = (
                f"needs {short.required}{which}, the nodes have {level_name(levels)}:"
                " glibc's loader refuses it (CPU ISA level is lower than required, exit 127),"
                " other loaders let it die of SIGILL"
            )
            self.add(Check.CPU_LEVEL, Severity.ERROR, path, message, entry)
            return
        message = (
            f"needs {short.required}{which}, but {self.platform} promises only"
            " x86-64-baseline CPUs (state the nodes' level with --cpu-level or an amd64/vN"
            " platform)"
        )
        self.add(Check.CPU_LEVEL, Severity.WARNING, path, message, entry)

    def _loader_check(self, path: str, info: ElfInfo, entry: bool) -> LibcFlavor | None:
        """Check PT_INTERP; return the libc rules to resolve libraries with, or None to stop."""
        interp = info.interpreter
        if interp is None:  # DT_NEEDED without a loader: the kernel runs it, nothing loads them
            return None
        wanted = libc_flavor(interp)
        image = self.libc.flavor()
        real = resolve(self.t.fs, interp)
        loader = self.t.fs.node(real) if real else None
        if loader is None or loader.kind != "file":
            if wanted is not None and image is not None and wanted != image:
                self.add(
                    Check.LIBC_MISMATCH,
                    Severity.ERROR,
                    path,
                    f"{wanted} binary in a {image} image: its loader {interp} is missing"
                    " (no such file or directory, exit 127)",
                    entry,
                )
            else:
                self.add(
                    Check.MISSING_INTERPRETER,
                    Severity.ERROR,
                    path,
                    f"ELF interpreter {interp} not found in the image"
                    " (no such file or directory, exit 127)",
                    entry,
                )
            return None
        if loader.elf is None or not info.same_abi(loader.elf):
            what = "not an ELF file" if loader.elf is None else f"ELF for {loader.elf.arch}"
            self.add(
                Check.MISSING_INTERPRETER,
                Severity.ERROR,
                path,
                f"ELF interpreter {interp} is {what} (accessing a corrupted shared library)",
                entry,
            )
            return None
        if wanted == "glibc" and self.libc.gcompat:
            self.add(
                Check.LIBC_MISMATCH,
                Severity.WARNING,
                path,
                "glibc binary on a musl image through gcompat: symbol versions are not"
                " checked and it can crash at run time (SIGSEGV, exit 139)",
                entry,
            )
            return "musl"
        return wanted or "glibc"

    def _check_script(self, path: str, node: Node, entry: bool) -> None:
        shebang = parse_shebang(node.head)
        if shebang is None:
            return  # ENOEXEC: shells rerun it with /bin/sh
        if shebang.crlf:
            self.add(
                Check.SHEBANG_CRLF,
                Severity.ERROR,
                path,
                f"#! line ends in CR (DOS line endings): the kernel looks for"
                f" {(shebang.interpreter if not shebang.argument else shebang.argument)!r}",
                entry,
            )
            return
        if self.t.isolated:
            return
        real = resolve(self.t.fs, shebang.interpreter)
        interp_node = self.t.fs.node(real) if real else None
        if real is None or interp_node is None or interp_node.kind != "file":
            self.add(
                Check.MISSING_SHEBANG_INTERPRETER,
                Severity.ERROR,
                path,
                f"#! interpreter {shebang.interpreter} not found in the image",
                entry,
            )
            return
        if entry and interp_node.executable:
            self._check_file(real, interp_node, entry=True)
        if posixpath.basename(shebang.interpreter) == "env" and shebang.argument:
            self._check_env(path, shebang.argument, entry)

    def _check_env(self, path: str, argument: str, entry: bool) -> None:
        command = _env_command(argument)
        if command is None:
            return
        if "/" in command:
            found = resolve(self.t.fs, command) is not None
        else:
            found = any(self._is_executable(posixpath.join(d, command)) for d in self.path)
        if not found:
            self.add(
                Check.ENV_NOT_ON_PATH,
                Severity.ERROR,
                path,
                f"#!/usr/bin/env runs {command!r}, which is not on PATH {':'.join(self.path)}",
                entry,
            )

    def _is_executable(self, path: str) -> bool:
        real = resolve(self.t.fs, path)
        node = self.t.fs.node(real) if real else None
        return node is not None and node.executable

    # --- config against binaries -----------------------------------------------------------

    def _check_config_platform(self) -> None:
        config = self.t.config_platform
        if config is None or not self.binary_platforms:
            return
        (dominant, count), total = (
            self.binary_platforms.most_common(1)[0],
            self.binary_platforms.total(),
        )
        if dominant == str(config) or count * 2 <= total:
            return
        try:
            if can_execute(config, Platform.parse(dominant)):
                return
        except ValueError:
            pass
        self.add(
            Check.ARCH_MISMATCH,
            Severity.ERROR,
            "(image config)",
            f"the image config says {config} but {count} of {total} ELF executables are"
            f" {dominant} (built FROM --platform=$BUILDPLATFORM?)",
            entry=False,
        )


def _describe(info: ElfInfo) -> str:
    return str(info.platform) if info.platform else info.arch


def _env_command(argument: str) -> str | None:
    """The program `env` will look up, given the one argument the kernel passes it."""
    if argument.startswith("-S") or argument.startswith("--split-string"):
        rest = argument.split(None, 1)[1] if " " in argument else argument[2:]
        try:
            words = shlex.split(rest)
        except ValueError:
            return None
        words = [w for w in words if "=" not in w and not w.startswith("-")]
        return words[0] if words else None
    if argument.startswith("-") or "=" in argument.split(" ")[0]:
        return None
    return argument  # without -S the whole rest of the line is ONE name, spaces included
