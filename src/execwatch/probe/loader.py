"""Open, configure, load and attach the BPF object; hand out its ring buffer and counters."""

from __future__ import annotations

import ctypes
import errno
import itertools
import logging
import os
import re
import signal
import struct
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import TypeVar

from execwatch.binfmt import emulation, node_platform
from execwatch.binfmt.emulation import Emulator
from execwatch.probe import caps, layout
from execwatch.probe.events import DEATH_WINDOW_S
from execwatch.probe.fairness import Describe, ShedWatch, describe_cgroup
from execwatch.probe.folds import FoldSlots
from execwatch.probe.libbpf import LibbpfMissing, RingBufferCallback, load_libbpf
from execwatch.probe.nodebinfmt import HOST_ROOT, NodeBinfmt
from execwatch.probe.nsbinfmt import Found, NamespaceBinfmt

log = logging.getLogger(__name__)
K = TypeVar("K", bound=ctypes.Structure)

VMLINUX_BTF = Path("/sys/kernel/btf/vmlinux")
LIBBPF_NAME = "libbpf.so.1"
TRACEFS_CANDIDATES = (Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing"))
EXEC_TRACEPOINT = "events/syscalls/sys_exit_execve"


BPF_PROG_TYPE_TRACEPOINT = 5
BPF_MAP_TYPE_ARRAY = 2
BPF_MAP_TYPE_RINGBUF = 27
COMPAT_HEADER = "compat.bpf.h"  # holds the one table of kernel versions
TABLE_ROW = re.compile(r"^ \* \| (\w+) +\| (\d+\.\d+) +\| (.+?) *\|$", re.MULTILINE)


class ProbeError(RuntimeError):
    """A one-line reason why the probe cannot run on this host."""


@dataclass(frozen=True)
class KernelChange:
    """A row of compat.bpf.h's table: what, the first release with it, the upstream change."""

    name: str
    since: str
    change: str


def kernel_changes(header: str) -> Mapping[str, KernelChange]:
    """The table of kernel versions in compat.bpf.h's text, by name."""
    rows = (KernelChange(*m.groups()) for m in TABLE_ROW.finditer(header))
    return MappingProxyType({row.name: row for row in rows})


def kernel_version(release: str) -> tuple[int, int]:
    major, _, rest = release.partition(".")
    minor = "".join(itertools.takewhile(str.isdigit, rest))
    return (int(major), int(minor or 0)) if major.isdigit() else (0, 0)


KERNEL = kernel_changes(resources.files("execwatch.bpf").joinpath(COMPAT_HEADER).read_text())
OLDEST_TESTED = kernel_version(KERNEL["supported"].since)  # tests/kernels boots it


@dataclass(frozen=True)
class KernelFeature:
    """A kernel capability the probe uses, asked of the running kernel's verifier."""

    name: str
    since: str  # the upstream release that introduced it
    helper: int | None = None  # BPF_FUNC_* id, tried in a tracepoint program
    map_type: int | None = None  # BPF_MAP_TYPE_*


def feature(name: str, *, helper: int | None = None, map_type: int | None = None) -> KernelFeature:
    """The feature `name`, with the release compat.bpf.h's table gives for it."""
    return KernelFeature(name, KERNEL[name].since, helper=helper, map_type=map_type)


# Without these the program cannot load: refuse with one line instead of a verifier dump.
REQUIRED = (
    feature("BPF_MAP_TYPE_RINGBUF", map_type=BPF_MAP_TYPE_RINGBUF),
    feature("bpf_ktime_get_boot_ns", helper=125),
    feature("bpf_probe_read_user_str", helper=114),
    feature("bpf_probe_read_kernel_str", helper=115),
    feature("bpf_get_current_cgroup_id", helper=80),
)
# Used where present; bpf/compat.bpf.h falls back without them, to the same result.
OPTIONAL = (
    feature("bpf_get_current_task_btf", helper=158),
    feature("bpf_task_pt_regs", helper=175),
)


@dataclass(frozen=True)
class ProbeOptions:
    ringbuf_bytes: int = 1 << 22
    count_entries: int = 16384  # (cgroup, errno) pairs counted per cgroup
    all_errnos: bool = False
    wakeup_interval_ms: float = 10.0
    object_path: Path | None = None
    # a process dying this soon after it started is reported
    death_window_ms: float = DEATH_WINDOW_S * 1000
    death_ringbuf_bytes: int = 1 << 20
    # Each cgroup's share of the events ring buffer (bpf/execwatch.h, "Fairness"): records
    # per second and back to back; 0: no budget. A crash loop fails a few times a second
    # and folding sends a PATH search's repeats once per window: far below either.
    budget_rate: float = 100.0
    budget_burst: int = 500
    budget_entries: int = 8192  # cgroups with a budget at once (an LRU: the oldest go)
    # The node's root directory: the binfmt_misc table and its interpreters are looked up
    # inside it (probe.nodebinfmt; the DaemonSet's agent: /proc/1/root).
    host_root: Path = HOST_ROOT
    # The binfmt_misc table, as a path inside host_root, whose foreign emulators the
    # emulation program watches (None: never attached), re-read at most this often, from
    # take_folds().
    binfmt_table: Path | None = emulation.TABLE
    binfmt_refresh_s: float = 10.0
    # Also the tables other namespaces mounted (Linux 6.7+: one per user namespace; see
    # probe.nsbinfmt): looked for at start and when the kernel counts a binfmt_misc mount.
    binfmt_namespaces: bool = True


def default_object_path() -> Path:
    return Path(str(resources.files("execwatch.bpf").joinpath("execwatch.bpf.o")))


def check_host() -> None:
    """Fail early with the real cause instead of a libbpf errno later on."""
    caps.raise_permitted()  # a non-root agent's interpreter holds them as file capabilities
    if not caps.has(caps.effective(), caps.CAP_BPF, caps.CAP_PERFMON):
        raise ProbeError(
            "execwatch needs CAP_BPF and CAP_PERFMON (root, or a user holding them) to load "
            "its probe"
        )
    if not VMLINUX_BTF.exists():
        raise ProbeError(f"this kernel exposes no BTF ({VMLINUX_BTF}): CO-RE cannot run")
    ensure_tracefs()


def ensure_tracefs() -> None:
    """libbpf finds syscall tracepoint ids in tracefs; mount it when the host has not."""
    if any((p / EXEC_TRACEPOINT).exists() for p in TRACEFS_CANDIDATES):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    target = TRACEFS_CANDIDATES[0]
    if libc.mount(b"tracefs", str(target).encode(), b"tracefs", 0, None) != 0:
        err = ctypes.get_errno()
        raise ProbeError(f"tracefs is not mounted and mounting it failed: {os.strerror(err)}")
    if not (target / EXEC_TRACEPOINT).exists():
        raise ProbeError("the kernel has no syscall tracepoints (CONFIG_FTRACE_SYSCALLS)")


class Probe:
    """The loaded and attached BPF program. Use as a context manager: close() detaches all.

    `fold_window_s`: ENOENT repeats of one name are only counted until the first
    take_folds() this long after the last new fold epoch (0: folding off). Not an option
    of its own in a NodeStack: there it is the pipeline's repeat window."""

    def __init__(self, options: ProbeOptions | None = None, *, fold_window_s: float = 1.0) -> None:
        self.options = options or ProbeOptions()
        self.fold_window_s = fold_window_s
        self._obj: int | None = None
        self._links: list[int] = []
        self._ringbuf: int | None = None
        self._callback: object = None
        self._callback_error: BaseException | None = None
        try:
            self._lib = load_libbpf(LIBBPF_NAME)
        except LibbpfMissing as exc:
            raise ProbeError(str(exc)) from exc
        self._ncpus = self._lib.libbpf_num_possible_cpus()
        self.features: dict[str, bool] = {}
        self._folds_lock = threading.Lock()  # take_folds and forget_counts: two threads
        self._folds: FoldSlots | None = None
        self.fold_key: list[int] = []  # the tags' NH key, random at each load
        self.shed = ShedWatch(describe_cgroup)
        self.emulation = EmulationState()
        table = self.options.binfmt_table or emulation.TABLE
        self.node_binfmt = NodeBinfmt(self.options.host_root, table)
        self.ns_binfmt = NamespaceBinfmt()

    def describe_cgroups_with(self, describe: Describe) -> None:
        """Name a crowding cgroup with `describe` (its pod, from attribution) instead of
        only its cgroup path."""
        self.shed = ShedWatch(describe)

    def __enter__(self) -> Probe:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> None:
        check_host()
        self.features = kernel_features(self._lib, (*REQUIRED, *OPTIONAL))
        require(self.features, REQUIRED)
        path = self.options.object_path or default_object_path()
        if not path.exists():
            raise ProbeError(f"BPF object {path} is missing: build it with `make bpf`")
        obj = self._lib.bpf_object__open_file(str(path).encode(), None)
        if not obj:
            raise ProbeError(f"cannot open {path}: {os.strerror(ctypes.get_errno())}")
        self._obj = obj
        try:
            check_layout(ObjectBtf.of(self._lib, obj))
            self._configure()
            self._choose_emulation()
            self._load_and_attach()
            self.refresh_emulators()
        except BaseException:
            self.close()
            raise
        release = os.uname().release
        log.info("probe attached", extra={"kv": {"kernel": release, **self.features}})
        if kernel_version(release) < OLDEST_TESTED:
            log.warning("kernel older than any tested", extra={"kv": {"kernel": release}})

    def _configure(self) -> None:
        self._lib.bpf_map__set_max_entries(self._map("events"), self.options.ringbuf_bytes)
        self._lib.bpf_map__set_max_entries(self._map("counts"), self.options.count_entries)
        self._lib.bpf_map__set_max_entries(self._map("deaths"), self.options.death_ringbuf_bytes)
        self._lib.bpf_map__set_max_entries(self._map("budgets"), self.options.budget_entries)
        sets = self._ncpus * layout.FOLD_SETS  # the program indexes by its CPU's number
        self._lib.bpf_map__set_max_entries(self._map("fold_slots"), sets)
        self._lib.bpf_map__set_max_entries(self._map("fold_names"), self._fold_entries())
        rodata = self._map_by_suffix(".rodata")
        size = ctypes.c_size_t()
        self._lib.bpf_map__initial_value(rodata, ctypes.byref(size))
        if size.value != ctypes.sizeof(layout.Config):
            raise ProbeError("BPF object and execwatch disagree on the config layout: rebuild it")
        cfg = layout.Config(
            wakeup_interval_ns=int(self.options.wakeup_interval_ms * 1e6),
            all_errnos=int(self.options.all_errnos),
            death_window_ns=int(self.options.death_window_ms * 1e6),
            fold_window_ns=round(self.fold_window_s * 1e9),
            **budget_config(self.options.budget_rate, self.options.budget_burst),
        )
        key = os.urandom(8 * layout.FOLD_KEY_WORDS)  # a tenant cannot know it
        self.fold_key = list(struct.unpack(f"{layout.FOLD_KEY_WORDS}Q", key))
        cfg.fold_key[:] = self.fold_key
        self._lib.bpf_map__set_initial_value(rodata, ctypes.byref(cfg), ctypes.sizeof(cfg))

    def _load_and_attach(self) -> None:
        rc = self._lib.bpf_object__load(self._obj)
        if rc < 0:
            raise ProbeError(f"the kernel refused the BPF program: {describe_errno(-rc)}")
        prog = self._lib.bpf_object__next_program(self._obj, None)
        while prog:
            if self._lib.bpf_program__name(prog).decode() == EMULATION_PROGRAM:
                prog = self._lib.bpf_object__next_program(self._obj, prog)
                continue  # attached while there are emulators: refresh_emulators()
            link = self._lib.bpf_program__attach(prog)
            if not link:
                name = self._lib.bpf_program__name(prog).decode()
                err = describe_errno(ctypes.get_errno())
                raise ProbeError(f"cannot attach {name}: {err}")
            self._links.append(link)
            prog = self._lib.bpf_object__next_program(self._obj, prog)
        data, size = self._map_by_suffix(".data"), ctypes.c_size_t()
        self._lib.bpf_map__initial_value(data, ctypes.byref(size))
        if size.value != ctypes.sizeof(layout.FoldClock):
            raise ProbeError("BPF object's .data is not its fold clock alone: rebuild it")
        clock_fd = self._lib.bpf_map__fd(data)

        def write_clock(clock: layout.FoldClock) -> None:
            zero = ctypes.c_uint32(0)
            rc = self._lib.bpf_map_update_elem(clock_fd, ctypes.byref(zero), ctypes.byref(clock), 0)
            if rc < 0:
                raise ProbeError(f"cannot start a fold epoch: {os.strerror(-rc)}")

        self._folds = FoldSlots(
            self._lib.bpf_map__fd(self._map("fold_slots")),
            self._lib.bpf_map__fd(self._map("fold_names")),
            self._fold_entries(),
            write_clock,
            self.fold_window_s,
        )

    def _choose_emulation(self) -> None:
        """Load the emulation program only where the kernel can run it (compat.bpf.h)."""
        problem = emulation_support(self._lib)
        self.emulation = EmulationState(supported=problem is None, unsupported=problem or "")
        if problem is not None:
            prog = self._lib.bpf_object__find_program_by_name(self._obj, EMULATION_PROGRAM.encode())
            if not prog:
                raise ProbeError(f"BPF object has no program {EMULATION_PROGRAM}: rebuild it")
            self._lib.bpf_program__set_autoload(prog, False)
            log.warning("emulated execs not watched", extra={"kv": {"reason": problem}})

    def refresh_emulators(self, *, force: bool = True) -> None:
        """Read the binfmt_misc tables again (at most every binfmt_refresh_s unless forced,
        or the kernel counted a binfmt_misc mount since) and watch their foreign emulators:
        attached while there is one, detached otherwise."""
        table_path, state = self.options.binfmt_table, self.emulation
        now, mounts = time.monotonic(), self.binfmt_mounts()
        due = force or now - state.read_at >= self.options.binfmt_refresh_s
        if table_path is None or not (due or mounts != state.mounts):
            return
        table = self.node_binfmt.read_table()
        node_arch = node_platform().architecture
        found = table.foreign(node_arch) if table is not None and table.enabled else ()
        elsewhere: tuple[Found, ...] = ()
        if self.options.binfmt_namespaces:
            if mounts != state.mounts or self.ns_binfmt.stale or state.read_at == float("-inf"):
                self.ns_binfmt.scan(self._node_table_devs())
            elsewhere = self.ns_binfmt.read(node_arch)
            # after fsopen(2) the table shows in mountinfo only once move_mount(2) has
            # attached it: the next periodic read walks /proc again
            self.ns_binfmt.stale |= mounts != state.mounts
        self.set_emulators(found, elsewhere)
        state.read_at, state.mounts = now, mounts

    def binfmt_mounts(self) -> int:
        """binfmt_misc file systems the kernel saw mounted since load (bpf: binfmt_mounts;
        0 for an object built before it, which the probe benchmark loads to compare)."""
        value, zero = ctypes.c_uint64(0), ctypes.c_uint32(0)
        found = self._lib.bpf_object__find_map_by_name(self._obj, b"binfmt_mounts")
        fd = self._lib.bpf_map__fd(found) if found else -1
        if fd < 0 or self._lib.bpf_map_lookup_elem(fd, ctypes.byref(zero), ctypes.byref(value)):
            return 0
        return int(value.value)

    def _node_table_devs(self) -> frozenset[int]:
        """The node's table's superblock: read as the node's, not as another namespace's."""
        try:
            return frozenset({os.stat(self.node_binfmt.table_path).st_dev})
        except OSError:
            return frozenset()

    def set_emulators(
        self, emulators: tuple[Emulator, ...], elsewhere: tuple[Found, ...] = ()
    ) -> None:
        """Watch exactly these emulators of the node (their interpreters, by inode in the
        node's root) and those found `elsewhere` (another namespace's table, identified in
        its root): the program is attached while there is one that the kernel can watch,
        else detached. One whose interpreter is not in the node's root is not watched."""
        state = self.emulation
        fd = self._lib.bpf_map__fd(self._map("emulators")) if state.supported else -1
        if fd >= 0:
            for key in list(self._keys(fd, layout.FileId)):
                self._lib.bpf_map_delete_elem(fd, ctypes.byref(key))
        node = [e for e, f in self.node_binfmt.identify(emulators) if self._watch(fd, e, f)]
        others = [f.emulator for f in elsewhere if self._watch(fd, f.emulator, f.file_id)]
        state.emulators, state.elsewhere = tuple(node), tuple(others)
        watched = node + others
        if watched and state.supported and state.link is None:
            state.link = self._attach(EMULATION_PROGRAM)
        elif not watched and state.link is not None:
            self._lib.bpf_link__destroy(state.link)
            state.link = None

    def _watch(self, fd: int, emu: Emulator, file_id: layout.FileId) -> bool:
        """Put the interpreter in the kernel's emulators map (fd -1: none to fill); False
        when every index is taken."""
        index = self.emulation.index(file_id, emu.arch)
        if index is None:
            return False
        value = layout.EmulatorEntry(index=index, arch=emu.arch.encode()[: layout.ARCH_LEN - 1])
        if fd >= 0:
            self._lib.bpf_map_update_elem(fd, ctypes.byref(file_id), ctypes.byref(value), 0)
        return True

    @property
    def emulation_attached(self) -> bool:
        return self.emulation.link is not None

    def binfmt_emulators(self) -> tuple[Emulator, ...]:
        """The foreign emulators of the last read of the node's table."""
        return self.emulation.emulators

    def namespace_emulators(self) -> tuple[Emulator, ...]:
        """The foreign emulators watched in other namespaces' tables (probe.nsbinfmt)."""
        return self.emulation.elsewhere

    def _attach(self, name: str) -> int:
        prog = self._lib.bpf_object__find_program_by_name(self._obj, name.encode())
        link = self._lib.bpf_program__attach(prog) if prog else None
        if not link:
            raise ProbeError(f"cannot attach {name}: {describe_errno(ctypes.get_errno())}")
        return int(link)

    def emulated_totals(self) -> dict[str, int]:
        """Emulated execs per emulated architecture since load (exact; per-CPU array)."""
        if not self.emulation.supported:
            return {}
        fd = self._lib.bpf_map__fd(self._map("emulated_totals"))
        totals: dict[str, int] = {}
        for index, arch in enumerate(self.emulation.archs):
            # 0 too: rate() then sees a node's first emulated exec.
            n = self._percpu_sum(fd, ctypes.c_uint32(index))
            totals[arch] = totals.get(arch, 0) + n
        return totals

    def _take_emulated(
        self, keep: Callable[[int], bool] | None = None
    ) -> dict[layout.FoldedName, int]:
        """Emulated repeats the kernel counted since the last call, per name; with `keep`,
        the names of cgroups it rejects are forgotten (their last counts still returned)."""
        if not self.emulation.supported:
            return {}
        fd, seen, read = (
            self._lib.bpf_map__fd(self._map("emulated_seen")),
            layout.EmulatedSeen(),
            self.emulation.read,
        )
        out: dict[layout.FoldedName, int] = {}
        for key in list(self._keys(fd, layout.EmulatedKey)):
            if self._lib.bpf_map_lookup_elem(fd, ctypes.byref(key), ctypes.byref(seen)) != 0:
                continue
            raw = bytes(key)
            name = bytes(key.filename).split(b"\0", 1)[0]
            n = seen.folded - read.get(raw, 0)
            if n:
                out[(key.cgroup_id, key.mntns, key.root_ino, 0, name, layout.KIND_EMULATED)] = n
            read[raw] = seen.folded
            if keep is not None and not keep(key.cgroup_id):
                self._lib.bpf_map_delete_elem(fd, ctypes.byref(key))
                del read[raw]
        return out

    def _fold_entries(self) -> int:
        """Slots (and names) of every possible CPU's sets."""
        return int(self._ncpus) * layout.FOLD_SLOTS

    def _map(self, name: str) -> int:
        m = self._lib.bpf_object__find_map_by_name(self._obj, name.encode())
        if not m:
            raise ProbeError(f"BPF object has no map {name!r}: rebuild it")
        return int(m)

    def _map_by_suffix(self, suffix: str) -> int:
        m = self._lib.bpf_object__next_map(self._obj, None)
        while m:
            if self._lib.bpf_map__name(m).decode().endswith(suffix):
                return int(m)
            m = self._lib.bpf_object__next_map(self._obj, m)
        raise ProbeError(f"BPF object has no {suffix} section: rebuild it")

    def program_fds(self) -> dict[str, int]:
        """Program name -> fd, for reading run_time_ns/run_cnt from /proc/self/fdinfo."""
        out: dict[str, int] = {}
        prog = self._lib.bpf_object__next_program(self._obj, None)
        while prog:
            out[self._lib.bpf_program__name(prog).decode()] = self._lib.bpf_program__fd(prog)
            prog = self._lib.bpf_object__next_program(self._obj, prog)
        return out

    def open_ring_buffer(self, on_record: Callable[[bytes], None]) -> None:
        """Deliver each raw record of both ring buffers (failed execs, early deaths) to
        on_record during poll(); each starts with its kind (see probe.events.KINDS)."""

        def trampoline(_ctx: int, data: int, size: int) -> int:
            try:
                on_record(ctypes.string_at(data, size))
            except BaseException as exc:  # ctypes would print and forget it: poll() re-raises
                self._callback_error = exc
                return -1  # libbpf stops consuming and poll() returns
            return 0

        self._callback = RingBufferCallback(trampoline)  # kept alive while libbpf holds it
        fd = self._lib.bpf_map__fd(self._map("events"))
        rb = self._lib.ring_buffer__new(fd, self._callback, None, None)
        if not rb:
            raise ProbeError(f"cannot open the ring buffer: {os.strerror(ctypes.get_errno())}")
        self._ringbuf = rb
        fd = self._lib.bpf_map__fd(self._map("deaths"))
        if self._lib.ring_buffer__add(rb, fd, self._callback, None) < 0:
            raise ProbeError(
                f"cannot open the deaths ring buffer: {os.strerror(ctypes.get_errno())}"
            )

    def poll(self, timeout_ms: int) -> int:
        """Wait up to timeout_ms for a wakeup, then consume every record present.

        Records submitted without a wakeup (see wakeup_flag in the BPF program) are
        collected here too, so timeout_ms bounds how long one can wait."""
        n = int(self._lib.ring_buffer__poll(self._ringbuf, timeout_ms))
        self._raise_callback_error()
        if n < 0 and -n != errno.EINTR:
            raise ProbeError(f"ring buffer poll failed: {os.strerror(-n)}")
        consumed = int(self._lib.ring_buffer__consume(self._ringbuf))
        self._raise_callback_error()
        return max(n, 0) + max(consumed, 0)

    def _raise_callback_error(self) -> None:
        if self._callback_error is not None:
            error, self._callback_error = self._callback_error, None
            raise error

    def _percpu_sum(self, fd: int, key: ctypes._CData) -> int:
        values = (ctypes.c_uint64 * self._ncpus)()
        if self._lib.bpf_map_lookup_elem(fd, ctypes.byref(key), values) != 0:
            return 0
        return sum(values)

    def errno_totals(self) -> dict[int, int]:
        """Exact count of failed execs per errno since load (per-CPU array: never full)."""
        fd = self._errno_totals_fd()
        totals = {}
        for err in range(1, 256):
            n = self._percpu_sum(fd, ctypes.c_uint32(err))
            if n:
                totals[err] = n
        return totals

    def death_totals(self) -> dict[str, int]:
        """Exact count of early deaths since load, by "SIGSEGV"-style signal or "EXIT127"."""
        fd = self._lib.bpf_map__fd(self._map("death_totals"))
        totals = {}
        for idx in range(1, layout.DEATH_TOTALS):
            n = self._percpu_sum(fd, ctypes.c_uint32(idx))
            if n:
                totals[death_label(idx)] = n
        return totals

    def stats(self) -> dict[str, int]:
        """Kernel-side drop counters by type."""
        fd = self._lib.bpf_map__fd(self._map("stats"))
        return {
            name: self._percpu_sum(fd, ctypes.c_uint32(i)) for i, name in layout.STAT_NAMES.items()
        }

    def counts_by_cgroup(self) -> dict[tuple[int, int], int]:
        """(cgroup id, errno) -> exact count, unless the map filled up (see stats()). A
        folded repeat is counted in its fold slot only: those are added here."""
        counts = dict(self._iter_counts(self._lib.bpf_map__fd(self._map("counts"))))
        with self._folds_lock:
            for pair, n in self._fold_slots().counts().items():
                counts[pair] = counts.get(pair, 0) + n
        return counts

    def forget_counts(self, keep: Callable[[int], bool]) -> int:
        """Delete the per-cgroup counts and fold totals of every cgroup `keep` rejects (the
        removed ones), so they never fill up with the dead; returns how many entries went.
        A removed cgroup's last folds still come with the next take_folds(). The budgets
        go too, after the sweep that names the cgroup that crowded the ring buffer most
        since the last one (see probe.fairness)."""
        fd = self._lib.bpf_map__fd(self._map("counts"))
        doomed = [key for key in self._keys(fd, layout.CountKey) if not keep(key.cgroup_id)]
        for key in doomed:
            self._lib.bpf_map_delete_elem(fd, ctypes.byref(key))
        self.shed.sweep(self.shed_by_cgroup())
        budgets = self._budgets_fd()
        for cgroup in [key for key, _ in self._budgets() if not keep(key.cgroup_id)]:
            self._lib.bpf_map_delete_elem(budgets, ctypes.byref(cgroup))
        with self._folds_lock:
            self._emulated_pending(self._take_emulated(keep))
            return len(doomed) + self._fold_slots().forget(keep)

    def _emulated_pending(self, folded: dict[layout.FoldedName, int]) -> None:
        for name, n in folded.items():
            self.emulation.pending[name] = self.emulation.pending.get(name, 0) + n

    def shed_by_cgroup(self) -> dict[int, int]:
        """Records each cgroup had withheld for being over its budget, since its budget
        entry was made (the total, exact, is stats()["cgroup_budget"])."""
        return {key.cgroup_id: budget.shed for key, budget in self._budgets() if budget.shed}

    def shed_top(self) -> tuple[Mapping[str, str], int] | None:
        """The living cgroup that had the most records withheld, named, and how many."""
        shed = self.shed_by_cgroup()
        if not shed:
            return None
        top = max(shed, key=lambda cg: shed[cg])
        return self.shed.name(top), shed[top]

    def _budgets(self) -> Iterator[tuple[layout.BudgetKey, layout.Budget]]:
        fd, budget = self._budgets_fd(), layout.Budget()
        for key in self._keys(fd, layout.BudgetKey):
            if self._lib.bpf_map_lookup_elem(fd, ctypes.byref(key), ctypes.byref(budget)) == 0:
                yield key, layout.Budget.from_buffer_copy(budget)

    def _budgets_fd(self) -> int:
        return int(self._lib.bpf_map__fd(self._map("budgets")))

    def take_folds(self) -> dict[layout.FoldedName, int]:
        """Repeats the kernel counted instead of sending (see ew_fold_slot), per name, since
        the last call. Each came after a record of that name, sent in the same fold epoch:
        a call once the fold window has passed since the last new epoch starts the next."""
        self.refresh_emulators(force=False)
        with self._folds_lock:
            taken = self._fold_slots().take()
            self._emulated_pending(self._take_emulated())
            taken.update(self.emulation.pending)
            self.emulation.pending.clear()
            return taken

    def _fold_slots(self) -> FoldSlots:
        if self._folds is None:
            raise ProbeError("the probe is not loaded")
        return self._folds

    def _errno_totals_fd(self) -> int:
        return int(self._lib.bpf_map__fd(self._map("errno_totals")))

    def _iter_counts(self, fd: int) -> Iterator[tuple[tuple[int, int], int]]:
        for key in self._keys(fd, layout.CountKey):
            yield (key.cgroup_id, key.err), self._percpu_sum(fd, key)

    def _keys(self, fd: int, key_type: type[K]) -> Iterator[K]:
        nxt = key_type()
        prev: K | None = None
        while (
            self._lib.bpf_map_get_next_key(
                fd, ctypes.byref(prev) if prev is not None else None, ctypes.byref(nxt)
            )
            == 0
        ):
            key = key_type.from_buffer_copy(nxt)
            yield key
            prev = key

    def close(self) -> None:
        if self._folds:
            self._folds.close()
            self._folds = None
        if self._ringbuf:
            self._lib.ring_buffer__free(self._ringbuf)
            self._ringbuf = None
        for link in self._links:
            self._lib.bpf_link__destroy(link)
        self._links.clear()
        if self.emulation.link is not None:
            self._lib.bpf_link__destroy(self.emulation.link)
            self.emulation.link = None
        if self._obj:
            self._lib.bpf_object__close(self._obj)
            self._obj = None


EMULATION_PROGRAM = "emulated_exec"


@dataclass
class EmulationState:
    """The emulation program: whether this kernel runs it, its link while attached (only
    while a binfmt_misc table has a foreign emulator), and what it watches."""

    supported: bool = False
    unsupported: str = ""  # why not, in one line
    link: int | None = None
    emulators: tuple[Emulator, ...] = ()  # watched now, of the node's table
    elsewhere: tuple[Emulator, ...] = ()  # watched now, of other namespaces' tables
    mounts: int = 0  # the kernel's binfmt_misc mount count at the last read
    # An interpreter's index in emulated_totals: one for each (inode, arch) since the load,
    # never reused, so the totals stay exact and never go down when the table changes.
    indexes: dict[tuple[int, int, str], int] = field(default_factory=dict)
    archs: list[str] = field(default_factory=list)  # by index
    read_at: float = float("-inf")
    read: dict[bytes, int] = field(default_factory=dict)  # emulated_seen key -> folded read
    pending: dict[layout.FoldedName, int] = field(default_factory=dict)  # taken, not handed

    def index(self, file_id: layout.FileId, arch: str) -> int | None:
        """The interpreter's index, a new one the first time; None once all are taken."""
        key = (file_id.dev, file_id.ino, arch)
        if key not in self.indexes:
            if len(self.archs) >= layout.EMULATORS:
                return None
            self.indexes[key] = len(self.archs)
            self.archs.append(arch)
        return self.indexes[key]


def emulation_support(lib: ctypes.CDLL) -> str | None:
    """Why this kernel cannot run the emulation program, or None (see compat.bpf.h)."""
    btf = lib.btf__load_vmlinux_btf()
    if not btf:
        return "no kernel BTF"
    try:
        vmlinux = ObjectBtf(lib, btf)
        if lib.btf__find_by_name_kind(btf, b"btf_trace_sched_process_exec", BTF_KIND_TYPEDEF) <= 0:
            return f"no BTF-enabled sched_process_exec tracepoint (Linux {KERNEL['tp_btf'].since}+)"
        found = vmlinux.struct("linux_binprm")
        names = {path for path, _, _ in found[1]} if found else set()
        missing = {"interpreter", "interp", "filename", "file"} - names
        if missing:
            since = KERNEL["linux_binprm_interpreter"].since
            return f"struct linux_binprm lacks {', '.join(sorted(missing))} (Linux {since}+)"
        return None
    finally:
        lib.btf__free(btf)


BTF_KIND_STRUCT = 4
BTF_KIND_ENUM = 6
BTF_KIND_TYPEDEF = 8


class BtfType(ctypes.Structure):  # struct btf_type (linux/btf.h)
    _fields_ = (("name_off", ctypes.c_uint32), ("info", ctypes.c_uint32), ("size", ctypes.c_uint32))


class BtfMember(ctypes.Structure):  # struct btf_member, after a struct's btf_type
    _fields_ = (
        ("name_off", ctypes.c_uint32),
        ("type", ctypes.c_uint32),
        ("offset", ctypes.c_uint32),
    )


class BtfEnum(ctypes.Structure):  # struct btf_enum, after an enum's btf_type
    _fields_ = (("name_off", ctypes.c_uint32), ("val", ctypes.c_int32))


# (dotted path, byte offset, size) of each scalar, string or array, nested structs flattened
FlatField = tuple[str, int, int]


@dataclass(frozen=True)
class ObjectBtf:
    """The types a BPF object was compiled with, read through libbpf."""

    lib: ctypes.CDLL
    btf: int

    @classmethod
    def of(cls, lib: ctypes.CDLL, obj: int) -> ObjectBtf:
        btf = lib.bpf_object__btf(obj)
        if not btf:
            raise ProbeError("BPF object carries no BTF: rebuild it with `make bpf`")
        return cls(lib, btf)

    def struct(self, name: str) -> tuple[int, list[FlatField]] | None:
        """The struct's size and flattened fields, or None if the object has no such struct."""
        type_id = self.lib.btf__find_by_name_kind(self.btf, name.encode(), BTF_KIND_STRUCT)
        if type_id <= 0:
            return None
        return self._type(type_id).size, list(self._fields(type_id, 0, ""))

    def enum(self, name: str) -> dict[str, int] | None:
        type_id = self.lib.btf__find_by_name_kind(self.btf, name.encode(), BTF_KIND_ENUM)
        if type_id <= 0:
            return None
        values = self._after(type_id, BtfEnum)
        return {self._name(v.name_off): v.val for v in values}

    def _fields(self, type_id: int, base: int, prefix: str) -> Iterator[FlatField]:
        kflag = self._type(type_id).info >> 31  # then the offset's top byte is a bitfield size
        for m in self._after(type_id, BtfMember):
            offset = base + (m.offset & 0xFFFFFF if kflag else m.offset) // 8
            path = prefix + self._name(m.name_off)
            resolved = self.lib.btf__resolve_type(self.btf, m.type)
            if (self._type(resolved).info >> 24) & 0x1F == BTF_KIND_STRUCT:
                yield from self._fields(resolved, offset, path + ".")
            else:
                yield path, offset, int(self.lib.btf__resolve_size(self.btf, m.type))

    def _type(self, type_id: int) -> BtfType:
        return BtfType.from_address(self.lib.btf__type_by_id(self.btf, type_id))

    def _after(self, type_id: int, entry: type[K]) -> ctypes.Array[K]:
        """The vlen entries that follow a type's btf_type."""
        address = self.lib.btf__type_by_id(self.btf, type_id)
        vlen = BtfType.from_address(address).info & 0xFFFF
        array: ctypes.Array[K] = (entry * vlen).from_address(address + ctypes.sizeof(BtfType))
        return array

    def _name(self, offset: int) -> str:
        return bytes(self.lib.btf__name_by_offset(self.btf, offset) or b"").decode()


def layout_mismatch(btf: ObjectBtf) -> str | None:
    """How the object's structs and record kinds differ from probe.layout's, or None."""
    for ctype, c_name in layout.DECLARED:
        found = btf.struct(c_name)
        if found is None:
            return f"the BPF object has no struct {c_name}"
        ours = [(f.path, f.offset, f.size) for f in layout.fields(ctype)]
        size, theirs = found
        for mine, its in itertools.zip_longest(ours, theirs):
            if mine != its:
                return f"struct {c_name}: the object has {its}, execwatch {mine}"
        if size != ctypes.sizeof(ctype):
            return (
                f"struct {c_name}: the object's is {size} bytes, execwatch's {ctypes.sizeof(ctype)}"
            )
    kinds = {r.c_kind: r.kind for r in layout.RECORDS}
    if btf.enum("ew_kind") != kinds:
        return f"enum ew_kind: the object has {btf.enum('ew_kind')}, execwatch {kinds}"
    return None


def check_layout(btf: ObjectBtf) -> None:
    """Refuse an object built from another execwatch.h than this execwatch's layout."""
    mismatch = layout_mismatch(btf)
    if mismatch:
        raise ProbeError(
            f"BPF object and execwatch disagree on the layout ({mismatch}): rebuild it"
        )


def budget_config(rate: float, burst: int) -> dict[str, int]:
    """ew_config's budget fields: `rate` records a second per cgroup, `burst` back to
    back (GCRA: see within_budget in the BPF program); rate 0 turns the budget off."""
    if rate < 0 or burst < 1:
        raise ValueError(f"a cgroup budget needs rate >= 0 and burst >= 1, not {rate}, {burst}")
    if rate == 0:
        return {"budget_interval_ns": 0, "budget_burst_ns": 0}
    interval = max(1, round(1e9 / rate))
    return {"budget_interval_ns": interval, "budget_burst_ns": (burst - 1) * interval}


def death_label(index: int) -> str:
    if index >= layout.TOTAL_EXIT:
        return f"EXIT{index - layout.TOTAL_EXIT}"
    try:
        return signal.Signals(index).name
    except ValueError:
        return f"SIG{index}"


def kernel_features(lib: ctypes.CDLL, features: tuple[KernelFeature, ...]) -> dict[str, bool]:
    """Feature name -> whether this kernel has it, by loading a tiny program or map for each.

    libbpf reports "unsupported" when it lacks the privilege to try: check that first."""
    fd = lib.bpf_map_create(BPF_MAP_TYPE_ARRAY, None, 4, 4, 1, None)
    if fd < 0:
        raise ProbeError(f"the kernel refused the BPF program: {describe_errno(-fd)}")
    os.close(fd)
    found = {}
    for f in features:
        if f.map_type is not None:
            rc = lib.libbpf_probe_bpf_map_type(f.map_type, None)
        else:
            rc = lib.libbpf_probe_bpf_helper(BPF_PROG_TYPE_TRACEPOINT, f.helper, None)
        if rc < 0:
            raise ProbeError(f"the kernel refused the BPF program: {describe_errno(-rc)}")
        found[f.name] = rc == 1
    return found


def require(found: dict[str, bool], required: tuple[KernelFeature, ...]) -> None:
    for f in required:
        if not found.get(f.name):
            oldest = ".".join(map(str, OLDEST_TESTED))
            raise ProbeError(
                f"this kernel ({os.uname().release}) lacks {f.name} (Linux {f.since}+): "
                f"execwatch needs Linux {oldest} or later"
            )


def describe_errno(err: int) -> str:
    hints = {
        errno.EPERM: "operation not permitted (need CAP_BPF, CAP_PERFMON; check lockdown/seccomp)",
        errno.ENOSYS: "BPF is not available in this kernel",
        errno.EINVAL: "invalid argument (kernel too old for this program?)",
    }
    return hints.get(err, os.strerror(err))
