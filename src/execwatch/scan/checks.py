"""The checks: will each executable of a filesystem start on a platform?

The rules (execwatch.runnable.rules, the node's too) judge each executable; each fault is
reported under the check that spells its Reason (vocabulary.py), with a severity and the
scan's wording (wording.py). `not-static`, `shebang-crlf` and `env-not-on-PATH` are the
scan's own checks. Executables are regular files with an execute bit that are ELF
programs, `#!` scripts, or executables of another OS (Mach-O, PE, a.out: a warning).
The image's entrypoint/cmd program (and its `#!` interpreter, and the first program of an
`sh -c` script) is checked first and its findings are marked, because its failure
crash-loops the pod. There a file that is neither ELF nor `#!` is an error
(missing-shebang: the runtime's init does not retry it with /bin/sh), except as the
shell's program, which the shell retries; elsewhere such a file is data, and silent.
"""

from __future__ import annotations

import posixpath
import shlex
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from execwatch.binfmt import (
    ElfInfo,
    LibcFlavor,
    Platform,
    can_execute,
    libc_flavor,
    parse_shebang,
    sniff,
)
from execwatch.binfmt.isa import platform_levels
from execwatch.runnable import rules
from execwatch.runnable.fs import FileSystem, Node, resolve
from execwatch.runnable.linker import Linker
from execwatch.runnable.reason import Reason
from execwatch.runnable.rules import Fault
from execwatch.scan import wording
from execwatch.scan.model import Finding, Severity, Stats
from execwatch.scan.shell import shell_command
from execwatch.scan.vocabulary import CHECK_OF_REASON, Check

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


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


Progress = Callable[[int], None]


class Checker:
    def __init__(self, target: Target) -> None:
        self.t = target
        self.platform = str(target.platform)
        self.linker = Linker(target.fs, target.env)
        self.libc = None if target.isolated else rules.image_libc(target.fs)
        self.findings: list[Finding] = []
        self.checked: set[str] = set()
        self._shell_started: set[str] = set()  # the first program of the entrypoint's sh -c
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

    def report(self, fault: Fault, severity: Severity, message: str, entry: bool) -> None:
        """A fault of the rules, under the check that spells its Reason."""
        self.add(CHECK_OF_REASON[fault.reason], severity, fault.path, message, entry)

    # --- entrypoint -------------------------------------------------------------------------

    def _check_entrypoint(self, argv: list[str]) -> None:
        program = argv[0]
        found = self._program(program)
        if found is None:
            where = "" if "/" in program else f" on PATH {':'.join(self.path)}"
            message = f"entrypoint program {program!r} not found{where}"
            self.report(rules.not_found(program), Severity.ERROR, message, entry=True)
            return
        self._check_file(*found, entry=True)
        word = shell_command(argv)
        started = self._program(word) if word is not None else None
        if started is not None:  # absent: a volume, a function or an alias may provide it
            self._shell_started.add(started[0])
            self._check_file(*started, entry=True)

    def _program(self, program: str) -> tuple[str, Node] | None:
        """The executable file `program` names, as the runtime's exec or a shell finds it."""
        candidates = (
            [posixpath.join(self.t.workdir, program)]
            if "/" in program
            else [posixpath.join(d, program) for d in self.path]
        )
        for candidate in candidates:
            real = resolve(self.t.fs, candidate)
            node = self.t.fs.node(real) if real else None
            if real and node is not None and node.kind == "file" and node.executable:
                return real, node
        return None

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
        else:
            self._check_other(path, node, entry)

    def _check_other(self, path: str, node: Node, entry: bool, counted: bool = False) -> None:
        """Neither ELF nor `#!`: another OS's executable, or (started) a missing `#!`.
        `counted`: a script, already counted as an executable."""
        if node.foreign is not None and (entry or node.foreign.executable):
            self.stats.executables += 0 if counted else 1
            fault = rules.foreign_os(path, node.foreign)
            severity = self._foreign_os_severity(entry)
            self.report(fault, severity, wording.foreign_os(fault), entry)
        elif entry and path not in self._shell_started:  # a shell retries it with /bin/sh
            self.stats.executables += 0 if counted else 1
            fault = rules.missing_shebang(path, node.head)
            self.report(fault, Severity.ERROR, wording.missing_shebang(fault), entry)

    def _check_elf(self, path: str, node: Node, entry: bool) -> None:
        self.stats.elf += 1
        if node.elf is None:
            self.stats.executables += 1
            corrupt = rules.corrupt_binary(path, node.elf_error or "")
            self.report(corrupt, Severity.ERROR, f"malformed ELF: {node.elf_error}", entry)
            return
        info = node.elf
        if not info.is_executable:
            return  # a shared library with an execute bit: checked through its users
        self.stats.executables += 1
        foreign = rules.foreign_architecture(path, info, self.t.platform)
        if foreign is not None and foreign.reason is Reason.FOREIGN_OS:
            severity = self._foreign_os_severity(entry)
            self.report(foreign, severity, wording.foreign_os(foreign), entry)
            return  # not an architecture the config could disagree with
        self.binary_platforms[wording.platform_of(info)] += 1
        if foreign is not None:
            message = wording.foreign(info, self.platform)
            self.report(foreign, Severity.ERROR, message, entry)
            return
        self._check_static(path, info, entry)
        if self.t.isolated or info.is_static:
            self._check_cpu(path, [(path, info.x86_isa_needed)], entry)
            return
        flavor = self._loader_check(path, info, entry)
        if flavor is not None:
            self._check_libraries(path, info, flavor, entry)

    def _foreign_os_severity(self, entry: bool) -> Severity:
        """An error for what the container starts (or a lone file), else a warning: an
        image may carry other platforms' builds it never runs."""
        return Severity.ERROR if entry or self.t.isolated else Severity.WARNING

    def _check_static(self, path: str, info: ElfInfo, entry: bool) -> None:
        if self.t.require_static and not info.is_static:
            how = f"loader {info.interpreter}" if info.interpreter else "DT_NEEDED libraries"
            message = f"dynamically linked ({how}); --require-static"
            self.add(Check.NOT_STATIC, Severity.ERROR, path, message, entry)

    def _check_libraries(self, path: str, info: ElfInfo, flavor: LibcFlavor, entry: bool) -> None:
        result = self.linker.resolve(path, info, flavor)
        self._check_cpu(path, [(o.path, o.info.x86_isa_needed) for o in result.loaded], entry)
        faults = rules.library_faults(result, path, info.interpreter)
        for fault in faults:
            self.report(fault, Severity.ERROR, fault.detail, entry)
        if faults:
            return
        for fault in rules.symbol_faults(self.linker, result, path):
            message = f"{fault.detail} (symbol lookup error, exit 127)"
            self.report(fault, Severity.ERROR, message, entry)

    def _check_cpu(self, path: str, objects: list[tuple[str, int]], entry: bool) -> None:
        """An x86-64 level the nodes lack: --cpu-level, else the platform's amd64 variant
        (an error), else plain amd64, which promises only the baseline (a warning)."""
        stated = self.t.cpu_levels is not None or self.t.platform.variant is not None
        levels = self.t.cpu_levels
        if levels is None:
            levels = platform_levels(self.t.platform)
        fault = rules.cpu_fault(path, objects, levels)
        if fault is None or levels is None:
            return
        if stated:
            self.report(fault, Severity.ERROR, wording.cpu_refused(fault, levels), entry)
        else:
            message = wording.cpu_unpromised(fault, self.platform)
            self.report(fault, Severity.WARNING, message, entry)

    def _loader_check(self, path: str, info: ElfInfo, entry: bool) -> LibcFlavor | None:
        """Check PT_INTERP; return the libc rules to resolve libraries with, or None to stop."""
        if info.interpreter is None:  # DT_NEEDED without a loader: the kernel runs it
            return None
        loader = rules.find_loader(self.t.fs, info.interpreter)
        fault = rules.loader_fault(path, info, loader, self.libc)
        if fault is not None:
            self.report(fault, Severity.ERROR, wording.loader_problem(fault, loader), entry)
            return None
        mismatch = rules.libc_fault(path, loader)
        if mismatch is not None:
            self.report(mismatch, Severity.WARNING, wording.libc_mismatch(loader), entry)
        return loader.flavor() or libc_flavor(info.interpreter) or "glibc"

    def _check_script(self, path: str, node: Node, entry: bool) -> None:
        shebang = parse_shebang(node.head)
        if shebang is None:  # ENOEXEC: shells rerun it with /bin/sh, a runtime does not
            self._check_other(path, node, entry, counted=True)
            return
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
            message = f"#! interpreter {shebang.interpreter} not found in the image"
            missing = rules.shebang_fault(path, shebang.interpreter)
            self.report(missing, Severity.ERROR, message, entry)
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
