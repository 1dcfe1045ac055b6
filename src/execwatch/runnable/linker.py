"""Find an executable's libraries the way the image's own dynamic loader would.

glibc (`elf/dl-load.c`): DT_RPATH of the loader chain (only when the requester has no
DT_RUNPATH), LD_LIBRARY_PATH, DT_RUNPATH, the ld.so.conf directories (what ldconfig puts in
ld.so.cache), then the default directories; candidates of another ABI are skipped; symbol
versions are checked by set membership (`elf/dl-version.c`), and a library without version
definitions satisfies any requirement. musl (`ldso/dynlink.c`): reserved libc names, then
LD_LIBRARY_PATH, the rpath chain ($ORIGIN only), `<prefix>/etc/ld-musl-<arch>.path` or
/lib:/usr/local/lib:/usr/lib; the first file found is used, whatever its ABI, and versions
are never checked.

Every resolve() runs on one work budget (`Work`, sized by runnable.limits.Limits): candidate
probes (names x directories), loop steps, bytes of paths and configuration, and a
deadline. The directories of all sources together (DT_RPATH, LD_LIBRARY_PATH, DT_RUNPATH,
ld.so.conf, the musl path file) are deduplicated and capped. When the budget runs out the
search stops: with a library already missing the result says it is incomplete (ld.so
stops at that library too), otherwise BudgetExhausted is raised. It never reports
"all libraries found" for a search it did not finish.
"""

from __future__ import annotations

import contextlib
import fnmatch
import posixpath
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from cachetools import LRUCache

from execwatch.binfmt import ElfInfo, LibcFlavor, musl_arch
from execwatch.binfmt.symbols import DynamicSymbols, SymbolRef
from execwatch.runnable.errors import LimitExceeded
from execwatch.runnable.fs import FileSystem, Node, resolve
from execwatch.runnable.limits import Limits

MUSL_RESERVED = ("c", "pthread", "rt", "m", "dl", "util", "xnet")
MAX_CONF_FILES = 256  # ld.so.conf and everything it includes, each file read once
MAX_CONF_DIRS = 4096  # distinct directories: each one is a candidate for every library
MUSL_DEFAULT_PATH = "/lib:/usr/local/lib:/usr/lib"
# Symbol tables kept across executables: every binary of an image asks libc and its few
# neighbours again. The benchmark's root (/usr of a Debian host) loads 285 distinct
# libraries, 17 MB of tables in all.
MAX_SYMBOL_TABLES = 1024
MAX_SYMBOL_BYTES = 64 << 20
# Answers kept (library, import) -> defined?: most programs import the same libc symbols.
MAX_SYMBOL_ANSWERS = 1 << 16
# Library lookups kept across executables, and the search-directory lists they are keyed
# by (one list can hold Limits.max_search_dirs paths; a Debian root has a few of 10 each).
MAX_LOOKUPS = 1 << 14
MAX_LISTED_DIRS = 1 << 16

# OCI architecture (or label) -> Debian multiarch tuple, for the default search directories.
MULTIARCH = {
    "amd64": "x86_64-linux-gnu",
    "x32": "x86_64-linux-gnux32",
    "386": "i386-linux-gnu",
    "arm64": "aarch64-linux-gnu",
    "ppc64le": "powerpc64le-linux-gnu",
    "ppc64": "powerpc64-linux-gnu",
    "s390x": "s390x-linux-gnu",
    "riscv64": "riscv64-linux-gnu",
    "mips64le": "mips64el-linux-gnuabi64",
    "mips64": "mips64-linux-gnuabi64",
    "mipsle": "mipsel-linux-gnu",
    "mips": "mips-linux-gnu",
    "loong64": "loongarch64-linux-gnu",
}
AT_PLATFORM = {"amd64": "x86_64", "386": "i686", "arm64": "aarch64", "ppc64le": "power8"}


@dataclass(frozen=True)
class LoadedObject:
    path: str  # the path the loader found it at ($ORIGIN is its directory)
    info: ElfInfo
    parent: LoadedObject | None = None


@dataclass(frozen=True)
class MissingLibrary:
    name: str
    needed_by: str
    reason: str


@dataclass(frozen=True)
class MissingVersion:
    version: str
    library: str
    needed_by: str


@dataclass(frozen=True)
class MissingSymbol:
    symbol: str
    version: str | None
    library: str | None  # the DT_NEEDED name the version is required from
    needed_by: str


class BudgetExhausted(LimitExceeded):
    """The linker's work budget ran out before it knew whether every library loads."""


@dataclass
class Work:
    """The work budget of one resolve(), and what it spent."""

    limits: Limits
    probes: int = 0
    steps: int = 0
    bytes: int = 0
    started: float = field(default_factory=time.monotonic)

    def spend(self, probes: int = 0, steps: int = 0, nbytes: int = 0) -> None:
        self.probes += probes
        self.steps += steps
        self.bytes += nbytes
        lim = self.limits
        if self.probes > lim.max_linker_probes:
            raise BudgetExhausted(
                f"library search: more than {lim.max_linker_probes} lookups (names x directories)"
            )
        if self.steps > lim.max_linker_steps:
            raise BudgetExhausted(f"library search: more than {lim.max_linker_steps} steps")
        if self.bytes > lim.max_linker_bytes:
            raise BudgetExhausted(
                f"library search: more than {lim.max_linker_bytes} bytes of paths and configuration"
            )
        if time.monotonic() - self.started > lim.max_linker_seconds:
            raise BudgetExhausted(f"library search took more than {lim.max_linker_seconds}s")


@dataclass
class Resolution:
    loaded: list[LoadedObject] = field(default_factory=list)
    missing: list[MissingLibrary] = field(default_factory=list)
    versions: list[MissingVersion] = field(default_factory=list)
    interpreter: LoadedObject | None = None
    flavor: LibcFlavor = "glibc"  # whose rules resolved it
    # Why the search stopped early (the budget), with `missing` holding what it found
    # before: the libraries after those were not searched.
    incomplete: str | None = None


@runtime_checkable
class SymbolSource(Protocol):
    """A FileSystem that can read an object's dynamic symbols again (a directory or a live
    root can; an image held in memory keeps only headers, so its symbols are unknown)."""

    def dynamic_symbols(self, path: str, imports: bool = True) -> DynamicSymbols | None: ...


def multiarch(info: ElfInfo) -> str | None:
    if info.arch == "arm":
        return "arm-linux-gnueabi" if info.float_abi == "soft" else "arm-linux-gnueabihf"
    return MULTIARCH.get(info.arch)


def is_musl_reserved(name: str) -> bool:
    """musl maps libc.*, libpthread.*, libm.* ... to itself and never opens them."""
    if not name.startswith("lib") or "/" in name:
        return False
    stem = name[3:].split(".", 1)
    return len(stem) == 2 and stem[0] in MUSL_RESERVED


class Linker:
    """Library resolution inside one image; results are cached across executables."""

    def __init__(self, fs: FileSystem, env: dict[str, str], limits: Limits | None = None) -> None:
        self.fs = fs
        self.limits = limits or Limits()
        self.work = Work(self.limits)  # the last resolve()'s
        self._ld_library_path = env.get("LD_LIBRARY_PATH", "")
        self._ld_library_path_list: list[str] | None = None
        self._conf_dirs: list[str] | None = None
        self._musl_paths: dict[str, list[str]] = {}
        self._lookups: LRUCache[tuple[str, int, str], tuple[str | None, str]] = LRUCache(
            MAX_LOOKUPS
        )
        # search list -> (its id, its length): MAX_LISTED_DIRS directories in all
        self._dir_lists: LRUCache[tuple[str, ...], tuple[int, int]] = LRUCache(
            MAX_LISTED_DIRS, getsizeof=lambda found: found[1]
        )
        self._next_list_id = 0
        # at most MAX_SYMBOL_TABLES tables of MAX_SYMBOL_BYTES in all
        self._symbols: LRUCache[str, DynamicSymbols | None] = LRUCache(
            MAX_SYMBOL_BYTES, getsizeof=lambda table: table.size if table is not None else 0
        )
        self._answers = _Answers()

    # --- public ---------------------------------------------------------------------------

    def resolve(self, path: str, info: ElfInfo, flavor: LibcFlavor) -> Resolution:
        """Raises BudgetExhausted when the budget runs out before any library is missing."""
        result = Resolution(flavor=flavor)
        self.work = Work(self.limits)
        by_name: dict[str, LoadedObject] = {}
        try:
            self._load_all(_Run(path, info, flavor, self.work), result, by_name)
        except BudgetExhausted as exc:
            if not result.missing:
                raise
            result.incomplete = str(exc)
            return result
        if flavor == "glibc":
            result.versions = self._check_versions(result.loaded, by_name)
        return result

    def _load_all(self, run: _Run, result: Resolution, by_name: dict[str, LoadedObject]) -> None:
        """Breadth first, as ld.so loads: each object once, each name once."""
        interp = result.interpreter = self._interpreter(run.exe)
        if interp is not None:
            by_name[posixpath.basename(interp.path)] = interp
            if interp.info.soname:
                by_name[interp.info.soname] = interp
        queue = deque([LoadedObject(run.path, run.exe)])
        seen_paths = {run.path}
        while queue:
            obj = queue.popleft()
            result.loaded.append(obj)
            for name in obj.info.needed:
                run.work.spend(steps=1)
                if name in by_name or (run.flavor == "musl" and is_musl_reserved(name)):
                    continue
                found, reason = self._find(name, obj, run)
                if found is None:
                    result.missing.append(MissingLibrary(name, obj.path, reason))
                    continue
                node = self.fs.node(found)
                assert node is not None and node.elf is not None
                lib = LoadedObject(found, node.elf, obj)
                by_name[name] = lib
                if node.elf.soname:
                    by_name.setdefault(node.elf.soname, lib)
                if found not in seen_paths:
                    seen_paths.add(found)
                    queue.append(lib)

    def missing_symbols(self, result: Resolution) -> list[MissingSymbol]:
        """The executable's non-weak imports that no loaded object exports (with the version
        asked for, under glibc's rules). Empty when the file system cannot read symbols, or
        one object is unknown: a guess would be worse than no answer."""
        if not isinstance(self.fs, SymbolSource) or not result.loaded:
            return []
        exe = result.loaded[0]
        wanted = self.fs.dynamic_symbols(exe.path)
        if wanted is None or not wanted.imports:
            return []
        providers: list[tuple[LoadedObject, str | None]] = [(o, o.path) for o in result.loaded[1:]]
        if result.interpreter is not None:  # PT_INTERP as written: a symlink on Debian
            providers.append((result.interpreter, resolve(self.fs, result.interpreter.path)))
        tables = _Providers(self._answers)
        for obj, real in providers:
            table = self._symbols_of(self.fs, real) if real is not None else None
            if real is None or table is None:
                return []
            tables.add(obj, real, table)
        imports = wanted.imports
        if result.flavor == "musl":  # musl binds by name and never looks at versions
            imports = tuple(ref._replace(version=None) for ref in imports)
        missing = []
        for ref in tables.not_known_defined(imports):
            defined = tables.define(ref)
            if defined is None:
                return []
            if not defined and _checkable(ref, result):
                missing.append(MissingSymbol(ref.name, ref.version, ref.library, exe.path))
        return missing

    def _symbols_of(self, fs: SymbolSource, path: str) -> DynamicSymbols | None:
        if path in self._symbols:
            return self._symbols[path]  # an LRU hit: now the newest
        table = fs.dynamic_symbols(path, imports=False)
        with contextlib.suppress(ValueError):  # one table over MAX_SYMBOL_BYTES: not kept
            self._symbols[path] = table
        while len(self._symbols) > MAX_SYMBOL_TABLES:
            self._symbols.popitem()
        return table

    # --- search -----------------------------------------------------------------------------

    def _interpreter(self, info: ElfInfo) -> LoadedObject | None:
        if info.interpreter is None:
            return None
        real = resolve(self.fs, info.interpreter)
        node = self.fs.node(real) if real else None
        if node is None or node.elf is None:
            return None
        return LoadedObject(info.interpreter, node.elf)

    def _find(self, name: str, obj: LoadedObject, run: _Run) -> tuple[str | None, str]:
        if "/" in name:
            name = self._expand_all(name, obj, run)[0]
            candidates: Iterable[str] = [name]
            list_id = -1
        else:
            dirs = run.dirs_of(obj, self)
            candidates = (posixpath.join(d, name) for d in dirs)
            list_id = self._list_id(dirs, run.work)
        key = (name, list_id, run.flavor + obj.info.arch + str(obj.info.elf_class))
        if key in self._lookups:
            return self._lookups[key]  # an LRU hit: now the newest
        result = self._first_match(candidates, obj.info, run)
        self._lookups[key] = result
        return result

    def _list_id(self, dirs: tuple[str, ...], work: Work) -> int:
        """A number for a search list, the key of the lookups made with it: the list is kept
        once (LRU, MAX_LISTED_DIRS in all), not once per lookup. Ids are never reused."""
        work.spend(steps=len(dirs))  # hashing the tuple
        found = self._dir_lists.get(dirs)  # an LRU hit: now the newest
        if found is not None:
            return found[0]
        list_id = self._next_list_id
        self._next_list_id += 1
        with contextlib.suppress(ValueError):  # one list over MAX_LISTED_DIRS: not kept
            self._dir_lists[dirs] = (list_id, len(dirs))
        return list_id

    def _first_match(
        self, candidates: Iterable[str], want: ElfInfo, run: _Run
    ) -> tuple[str | None, str]:
        rejected: list[str] = []
        for candidate in candidates:
            run.work.spend(probes=1, nbytes=len(candidate))
            real = resolve(self.fs, candidate)
            node: Node | None = self.fs.node(real) if real else None
            if real is None or node is None or node.kind != "file":
                continue
            info = node.elf
            usable = info is not None and want.same_abi(info) and _float_abi_ok(want, info)
            if usable:
                return real, ""
            label = "not an ELF file" if info is None else info.arch
            if run.flavor == "musl":  # musl opens the first file it finds, then fails to map it
                return None, f"{candidate} is {label}, not {want.arch}"
            rejected.append(f"{candidate} ({label})")
        if rejected:
            return None, "skipped wrong-ABI candidates: " + ", ".join(rejected[:3])
        return None, "not found in the search path"

    def search_dirs(self, obj: LoadedObject, run: _Run) -> tuple[str, ...]:
        """The directories searched for obj's DT_NEEDED names, in order, each once."""
        dirs = _DirList(run.work, self.limits.max_search_dirs)
        if run.flavor == "musl":
            dirs.add(self._ld_library_path_dirs(run.work))
            node: LoadedObject | None = obj
            while node is not None:
                rpath = node.info.runpath or node.info.rpath
                dirs.add(
                    self._expand_all(d, node, run)[0]
                    for d in _steps(rpath, run.work)
                    if _musl_expandable(d)
                )
                node = node.parent
            dirs.add(self._musl_path(run.exe, run.work))
            return tuple(dirs.seen)
        if not obj.info.runpath:
            node = obj
            while node is not None:
                if not node.info.runpath:
                    dirs.add(
                        x
                        for d in _steps(node.info.rpath, run.work)
                        for x in self._expand_all(d, node, run)
                    )
                node = node.parent
        dirs.add(self._ld_library_path_dirs(run.work))
        dirs.add(
            x for d in _steps(obj.info.runpath, run.work) for x in self._expand_all(d, obj, run)
        )
        dirs.add(self._ld_so_conf(run.work))
        dirs.add(self._default_dirs(obj.info))
        return tuple(dirs.seen)

    def _ld_library_path_dirs(self, work: Work) -> list[str]:
        if self._ld_library_path_list is None:
            work.spend(nbytes=len(self._ld_library_path))
            self._ld_library_path_list = parse_ld_library_path(self._ld_library_path, self.limits)
        return self._ld_library_path_list

    def _expand_all(self, text: str, obj: LoadedObject, run: _Run) -> list[str]:
        origin = run.origin_of(obj, self.fs)
        out = text.replace("${ORIGIN}", origin).replace("$ORIGIN", origin)
        platform = AT_PLATFORM.get(obj.info.arch, obj.info.arch)
        out = out.replace("${PLATFORM}", platform).replace("$PLATFORM", platform)
        if "$LIB" not in out and "${LIB}" not in out:
            return [out]
        libs = [f"lib/{t}" for t in [multiarch(obj.info)] if t]
        libs += ["lib64" if obj.info.bits == 64 else "lib32", "lib"]
        return [out.replace("${LIB}", lib).replace("$LIB", lib) for lib in libs]

    def _default_dirs(self, info: ElfInfo) -> list[str]:
        out = []
        triplet = multiarch(info)
        if triplet:
            out += [f"/lib/{triplet}", f"/usr/lib/{triplet}"]
        out += ["/lib64", "/usr/lib64"] if info.bits == 64 else ["/lib32", "/usr/lib32"]
        return [*out, "/lib", "/usr/lib"]

    def _ld_so_conf(self, work: Work | None = None) -> list[str]:
        if self._conf_dirs is None:
            conf = _ConfWalk()
            self._read_conf("/etc/ld.so.conf", conf, work or Work(self.limits))
            self._conf_dirs = list(conf.dirs)
        return self._conf_dirs

    def _read_conf(self, path: str, conf: _ConfWalk, work: Work) -> None:
        if path in conf.named:  # every file of a .d directory may include the directory
            return
        conf.named.add(path)
        real = resolve(self.fs, path)
        if real is None or real in conf.read:
            return
        if len(conf.read) >= MAX_CONF_FILES:
            raise LimitExceeded(f"/etc/ld.so.conf includes more than {MAX_CONF_FILES} files")
        conf.read.add(real)
        node = self.fs.node(real)
        if node is None or node.text is None:
            return
        work.spend(nbytes=len(node.text))
        for raw in node.text.decode(errors="replace").splitlines():
            work.spend(steps=1)
            line = raw.split("#", 1)[0].strip()
            if not line or line.startswith("hwcap "):
                continue
            if line.startswith("include"):
                for pattern in line.split()[1:]:
                    if not pattern.startswith("/"):
                        pattern = posixpath.join(posixpath.dirname(path), pattern)
                    if pattern not in conf.named:
                        conf.named.add(pattern)
                        for match in self._glob(pattern, work):
                            self._read_conf(match, conf, work)
                continue
            for d in line.replace(",", " ").replace(":", " ").split():
                work.spend(steps=1)
                if d.startswith("/"):
                    conf.dirs[d] = None
            if len(conf.dirs) > MAX_CONF_DIRS:
                raise LimitExceeded(f"/etc/ld.so.conf names more than {MAX_CONF_DIRS} directories")

    def _glob(self, pattern: str, work: Work) -> list[str]:
        directory, base = posixpath.split(pattern)
        real = resolve(self.fs, directory)
        if real is None:
            return []
        return [
            posixpath.join(directory, n)
            for n in _steps(self.fs.listdir(real), work)
            if fnmatch.fnmatch(n, base)
        ]

    def _musl_path(self, exe: ElfInfo, work: Work) -> list[str]:
        arch = musl_arch(exe) or ""
        if arch not in self._musl_paths:
            prefix = ""
            if exe.interpreter and exe.interpreter.startswith("/"):
                prefix = posixpath.dirname(posixpath.dirname(exe.interpreter))
                prefix = "" if prefix == "/" else prefix
            node = None
            real = resolve(self.fs, f"{prefix}/etc/ld-musl-{arch}.path")
            if real is not None:
                node = self.fs.node(real)
            text = node.text.decode(errors="replace") if node and node.text is not None else None
            path = text if text is not None else MUSL_DEFAULT_PATH
            work.spend(nbytes=len(path))
            entries = _steps(path.replace("\n", ":").split(":"), work)
            self._musl_paths[arch] = list(dict.fromkeys(d for d in entries if d))
        return self._musl_paths[arch]

    # --- versions ---------------------------------------------------------------------------

    def _check_versions(
        self, loaded: list[LoadedObject], by_name: dict[str, LoadedObject]
    ) -> list[MissingVersion]:
        out = []
        for obj in loaded:
            for need in obj.info.version_needs:
                lib = by_name.get(need.file)
                if lib is None or not lib.info.version_defs:
                    continue  # not loaded (reported as missing) or no versioning: accepted
                for req in need.versions:
                    if not req.weak and req.name not in lib.info.version_defs:
                        out.append(MissingVersion(req.name, lib.path, obj.path))
        return out


def _checkable(ref: SymbolRef, result: Resolution) -> bool:
    """A versioned import from a library that did not load is already a MissingLibrary."""
    if ref.library is None:
        return True
    names = {posixpath.basename(o.path) for o in result.loaded}
    names |= {o.info.soname for o in result.loaded if o.info.soname}
    if result.interpreter is not None:
        names.add(posixpath.basename(result.interpreter.path))
        names |= {result.interpreter.info.soname or ""}
    return ref.library in names or not any(m.name == ref.library for m in result.missing)


class _Answers:
    """What a scan learnt about its libraries' exports, shared by its executables: the
    imports each library is known to define, and every other answer (path, import) ->
    defined? (False, or None for unknown). MAX_SYMBOL_ANSWERS in all, then forgotten."""

    def __init__(self) -> None:
        self.defined: dict[str, set[SymbolRef]] = {}
        self.other: dict[tuple[str, SymbolRef], bool | None] = {}
        self.count = 0

    def add(self, path: str, ref: SymbolRef, found: bool | None) -> None:
        if self.count >= MAX_SYMBOL_ANSWERS:
            self.defined.clear()
            self.other.clear()
            self.count = 0
        self.count += 1
        if found:
            self.defined.setdefault(path, set()).add(ref)
        else:
            self.other[path, ref] = found


class _Providers:
    """The loaded objects' symbol tables, and which one a versioned import names."""

    def __init__(self, answers: _Answers) -> None:
        self.tables: list[tuple[str, DynamicSymbols]] = []
        self.by_name: dict[str, tuple[str, DynamicSymbols]] = {}
        self.answers = answers

    def add(self, obj: LoadedObject, real: str, table: DynamicSymbols) -> None:
        self.tables.append((real, table))
        self.by_name.setdefault(posixpath.basename(obj.path), (real, table))
        if obj.info.soname:
            self.by_name.setdefault(obj.info.soname, (real, table))

    def not_known_defined(self, imports: tuple[SymbolRef, ...]) -> list[SymbolRef]:
        """The imports that no loaded object is already known to define, in their order.
        After the first few programs most imports are known: this is a few set operations
        per program, in C, instead of a lookup per import."""
        left = set(imports)
        for path, _ in self.tables:
            if not left:
                return []
            known = self.answers.defined.get(path)
            if known:
                left = left - known  # iterates `left`, the smaller set
        return [ref for ref in imports if ref in left]

    def define(self, ref: SymbolRef) -> bool | None:
        """Whether any of them defines `ref`; None if none does and one could not tell.
        The library the version is required from is asked first: usually it has it."""
        first = self.by_name.get(ref.library) if ref.library else None
        ordered = self.tables if first is None else (first, *self.tables)
        unknown = False
        answers = self.answers
        for path, table in ordered:
            if ref in answers.defined.get(path, ()):
                return True
            found = answers.other.get((path, ref), _UNASKED)
            if found is _UNASKED:
                found = table.defines(ref)
                answers.add(path, ref, found)
            if found:
                return True
            unknown = unknown or found is None
        return None if unknown else False


_UNASKED = object()


@dataclass
class _ConfWalk:
    """One reading of ld.so.conf and its includes: each file and each pattern once."""

    dirs: dict[str, None] = field(default_factory=dict)  # ordered, each directory once
    read: set[str] = field(default_factory=set)  # resolved files read
    named: set[str] = field(default_factory=set)  # include names and patterns followed


def _musl_expandable(entry: str) -> bool:
    """musl expands $ORIGIN only; an rpath with any other $ token is ignored."""
    rest = entry.replace("${ORIGIN}", "").replace("$ORIGIN", "")
    return "$" not in rest


def _float_abi_ok(want: ElfInfo, got: ElfInfo) -> bool:
    return want.float_abi is None or got.float_abi is None or want.float_abi == got.float_abi


def parse_ld_library_path(value: str, limits: Limits) -> list[str]:
    """LD_LIBRARY_PATH's directories, each once (`;` separates too, as in glibc); bounded
    before it is split."""
    if len(value) > limits.max_ld_library_path_bytes:
        raise LimitExceeded(
            f"LD_LIBRARY_PATH is longer than {limits.max_ld_library_path_bytes} bytes"
        )
    entries = value.replace(";", ":").split(":")
    if len(entries) > limits.max_ld_library_path_entries:
        raise LimitExceeded(
            f"LD_LIBRARY_PATH has more than {limits.max_ld_library_path_entries} entries"
        )
    return list(dict.fromkeys(d for d in entries if d))


def _steps(items: Iterable[str], work: Work) -> Iterator[str]:
    for item in items:
        work.spend(steps=1)
        yield item


@dataclass
class _DirList:
    """One search list: every source's directories in order, each once, capped in all."""

    work: Work
    cap: int
    seen: dict[str, None] = field(default_factory=dict)

    def add(self, dirs: Iterable[str]) -> None:
        for d in dirs:
            self.work.spend(steps=1)
            if not d or d in self.seen:
                continue
            self.work.spend(nbytes=len(d))
            self.seen[d] = None
            if len(self.seen) > self.cap:
                raise BudgetExhausted(
                    f"more than {self.cap} library search directories (DT_RPATH, LD_LIBRARY_PATH,"
                    " DT_RUNPATH, ld.so.conf and the musl path file together)"
                )


@dataclass
class _Run:
    """One resolve(): its budget, and what it worked out per loaded object."""

    path: str
    exe: ElfInfo
    flavor: LibcFlavor
    work: Work
    dirs: dict[str, tuple[str, ...]] = field(default_factory=dict)
    origin: str | None = None

    def dirs_of(self, obj: LoadedObject, linker: Linker) -> tuple[str, ...]:
        """Each object is loaded once per run (by path), so its list is built once."""
        found = self.dirs.get(obj.path)
        if found is None:
            found = self.dirs[obj.path] = linker.search_dirs(obj, self)
        return found

    def origin_of(self, obj: LoadedObject, fs: FileSystem) -> str:
        """$ORIGIN; the main program's comes from /proc/self/exe: resolved, once."""
        if obj.parent is not None:
            return posixpath.dirname(obj.path) or "/"
        if self.origin is None:
            real = resolve(fs, obj.path)
            self.origin = posixpath.dirname(real if real else obj.path) or "/"
        return self.origin
