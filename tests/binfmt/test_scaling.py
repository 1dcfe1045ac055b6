"""Every tenant-input parser of binfmt on hostile inputs of growing size (x2 steps, up to
16 MiB or the parser's count limits): its work grows at most linearly with the input, or
stops at its budget, and it never fails open.

The main assertions count work (version records walked, name bytes, loop steps, bytes
read from the file). Time and peak traced memory are compared within one run, with a generous margin
for this shared 2-core machine: 16x the input may cost at most 40x the first size's (a
quadratic reader costs 256x). A floor absorbs the noise of sub-millisecond first sizes.

Set BINFMT_SYMBOLS_UNDER_TEST to the path of another copy of binfmt/symbols.py to run the
symbol tests against it: `git show HEAD~1:src/execwatch/binfmt/symbols.py > /tmp/old.py`
shows what these tests caught (the 66 KB Verneed table of 8 s, the 2 MiB file).
"""

from __future__ import annotations

import importlib.util
import io
import os
import shutil
import signal
import struct
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

from execwatch.binfmt import BinfmtError, ElfInfo, Shebang, parse_shebang, read_elf
from execwatch.binfmt.elf import DEFAULT_LIMITS as ELF_LIMITS
from execwatch.binfmt.errors import ParseLimitExceeded
from execwatch.binfmt.isa import MAX_NOTE_BYTES, parse_isa_needed
from execwatch.binfmt.platform import Platform
from execwatch.diagnosis.startup import explain
from execwatch.runnable.liveroot import RootView
from execwatch.runnable.openat2 import Root
from execwatch.scan.runner import ScanOptions, scan
from tests.support.binfmt.elfbuild import DT, ElfSpec, build_elf
from tests.support.binfmt.hostile_elf import BASE, PT_NOTE, raw_elf64
from tests.support.binfmt.version_tables import (
    SHT_VERNEED,
    imports_long_name,
    shared_chain,
    verdef_long_name,
    verneed_per_import,
    verneed_shared_chain,
)


def _symbols_module() -> ModuleType:
    path = os.environ.get("BINFMT_SYMBOLS_UNDER_TEST")
    if not path:
        from execwatch.binfmt import symbols

        return symbols
    spec = importlib.util.spec_from_file_location("symbols_under_test", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


SYMBOLS = _symbols_module()
MARGIN = 2.5  # x the linear cost: 16x the input within 40x the time or memory
FLOOR_SECONDS = 0.005
FLOOR_BYTES = 256 << 10
SECONDS = 0.5  # any one input, on top of the ratios
GIVE_UP = 3.0  # one input taking this long has failed: stop it rather than wait
MiB = 1 << 20


class TooSlow(BaseException):
    """Raised by the alarm: a BaseException, so that no parser's `except` swallows it."""


@contextmanager
def alarm(seconds: float) -> Iterator[None]:
    def ring(signum: int, frame: object) -> None:
        raise TooSlow(f"still running after {seconds}s")

    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclass(frozen=True)
class Run:
    size: int
    seconds: float  # best of two
    peak: int  # traced Python memory of one run
    outcome: object  # the result, or the BinfmtError raised


def run(parse: Callable[[bytes], object], data: bytes) -> Run:
    """Parse `data` twice for time, once more under tracemalloc for its peak."""
    best = float("inf")
    outcome: object = None
    with alarm(GIVE_UP):
        for _ in range(2):
            start = time.perf_counter()
            try:
                outcome = parse(data)
            except BinfmtError as exc:
                outcome = exc
            best = min(best, time.perf_counter() - start)
        tracemalloc.start()
        try:
            parse(data)
        except BinfmtError:
            pass
        finally:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
    return Run(len(data), best, peak, outcome)


def sizes(first: int, last: int) -> list[int]:
    out = [first]
    while out[-1] * 2 <= last:
        out.append(out[-1] * 2)
    return out


def grow(
    make: Callable[[int], bytes], parse: Callable[[bytes], object], steps: list[int]
) -> list[Run]:
    """Run each size in turn, failing at the first that breaks the linear bound."""
    runs: list[Run] = []
    for step in steps:
        try:
            runs.append(run(parse, make(step)))
        except TooSlow:
            pytest.fail(f"input of size step {step} took more than {GIVE_UP}s: {runs[-1:]}")
        assert_linear(runs)
    return runs


def assert_linear(runs: list[Run]) -> None:
    base, last = runs[0], runs[-1]
    factor = last.size / base.size
    allowed = max(base.seconds, FLOOR_SECONDS) * factor * MARGIN
    assert last.seconds <= min(allowed, SECONDS) or last.seconds <= FLOOR_SECONDS, (
        f"{last.size:,} bytes took {last.seconds:.3f}s, {base.size:,} bytes {base.seconds:.4f}s"
        f" (at most {min(allowed, SECONDS):.3f}s)"
    )
    allowed_bytes = max(base.peak, FLOOR_BYTES) * factor * MARGIN
    assert last.peak <= allowed_bytes, (
        f"{last.size:,} bytes peaked at {last.peak:,} bytes, {base.size:,} at {base.peak:,}"
    )


# --- symbol versions and dynamic symbols (binfmt/symbols.py) --------------------------------


def read_symbols(data: bytes) -> object:
    elf = io.BytesIO(data)
    return SYMBOLS.read_dynamic_symbols(elf, read_elf(elf))


def refused(outcome: object) -> bool:
    return isinstance(outcome, BinfmtError)


SYMBOL_FAMILIES: dict[str, tuple[Callable[[int], bytes], list[int]]] = {
    "verneed-shared-chain": (verneed_shared_chain, sizes(4 << 10, 16 * MiB)),
    "verdef-long-name": (verdef_long_name, sizes(16 << 10, 16 * MiB)),
    "imports-long-name": (imports_long_name, sizes(1 << 10, 16 * MiB)),
}


@pytest.mark.parametrize("family", sorted(SYMBOL_FAMILIES))
def test_symbol_reader_cost_is_linear_and_hostile_tables_are_refused(family: str) -> None:
    make, steps = SYMBOL_FAMILIES[family]
    runs = grow(make, read_symbols, steps)
    assert refused(runs[-1].outcome), f"{family}: {runs[-1].outcome!r} at 16 MiB"


def test_the_reported_inputs_are_refused_in_milliseconds() -> None:
    """A 66 KB Verneed table took 8.1 s (11.8 s in the report) and a 2 MiB file 4.7 s, in
    the node agent and in `execwatch scan`: now both are refused, in milliseconds."""
    for data in (verneed_shared_chain(66 << 10), verdef_long_name(2 * MiB)):
        result = run(read_symbols, data)
        assert refused(result.outcome), repr(result.outcome)
        assert result.seconds < 0.1, f"{len(data):,} bytes: {result.seconds:.3f}s"
        assert result.peak < 3 * len(data) + 2 * MiB, f"peak {result.peak:,} bytes"


def test_a_version_for_every_import_or_a_refusal_never_a_partial_table() -> None:
    """Well-formed but big: every import keeps its version up to the record budget (4,096
    Verneeds with one Vernaux each), then the file is refused, never read in part (the
    old reader kept 16,384 version indexes: of 30,000 imports, 13,616 lost their version
    and would have been checked by name only). Time and memory: the tests above."""
    outcomes = {}
    for count in (*sizes(256, 8192), 30000):
        try:
            outcomes[count] = read_symbols(verneed_per_import(count))
        except BinfmtError as exc:
            outcomes[count] = exc
    for count, outcome in outcomes.items():
        if isinstance(outcome, SYMBOLS.DynamicSymbols):
            versions = [ref.version for ref in outcome.imports]
            assert len(versions) == count and set(versions) == {"FOO_1.0"}, count
        else:
            assert isinstance(outcome, ParseLimitExceeded), repr(outcome)
    assert isinstance(outcomes[4096], SYMBOLS.DynamicSymbols)  # 8,192 records
    assert isinstance(outcomes[8192], ParseLimitExceeded)
    assert isinstance(outcomes[30000], ParseLimitExceeded)


@pytest.mark.parametrize(
    "make", [verneed_shared_chain, verdef_long_name, verneed_per_import, imports_long_name]
)
def test_symbol_work_counts_grow_linearly_up_to_the_budget(make: Callable[[int], bytes]) -> None:
    """Deterministic: version records visited, name bytes decoded, steps and bytes read,
    for inputs of x2 growing size; none passes its limit, and none grows faster than the
    input (each offset visited once, each name decoded once)."""
    limits = SYMBOLS.DEFAULT_LIMITS
    counts = []
    for step in sizes(256, 4096) if make is verneed_per_import else sizes(4 << 10, 4 * MiB):
        data = make(step)
        work = SYMBOLS.SymbolWork()
        elf = io.BytesIO(data)
        info = read_elf(elf)
        with suppress(BinfmtError):
            SYMBOLS.read_dynamic_symbols(elf, info, work=work)
        counts.append((len(data), work))
        assert work.records <= limits.max_records
        # Names are charged a chunk of imports at a time, before they are sliced.
        assert work.name_bytes <= limits.max_name_bytes + SYMBOLS.CHUNK * SYMBOLS.MAX_STRING_BYTES
        assert work.read_bytes <= len(data)
    (first, w0), (last, w1) = counts[0], counts[-1]
    factor = last / first
    for field in ("records", "name_bytes", "steps", "read_bytes"):
        a, b = getattr(w0, field), getattr(w1, field)
        assert b <= max(a, 64) * factor * 1.1, f"{field}: {a} at {first:,} bytes, {b} at {last:,}"


def hostile_root(tmp: Path, size: int) -> Path:
    """A root with the host's loader and libc and /usr/bin/hostile: /bin/true whose
    .gnu.version_r section header points at an appended `size`-byte shared-chain table
    (read_elf follows DT_VERNEED, which stays sound; the symbol reader, the section)."""
    root = tmp / f"root-{size}"
    with open("/bin/true", "rb") as f:
        true = read_elf(f)
    assert true.interpreter is not None
    for path in (true.interpreter, "/lib/x86_64-linux-gnu/libc.so.6"):
        (root / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(os.path.realpath(path), root / path.lstrip("/"))
    data = bytearray(Path("/bin/true").read_bytes())
    (shoff,), (shentsize, shnum) = (
        struct.unpack_from("<Q", data, 0x28),
        struct.unpack_from("<HH", data, 0x3A),
    )
    at = len(data) + -len(data) % 8
    table = shared_chain(size)
    for i in range(shnum):
        header = shoff + i * shentsize
        if struct.unpack_from("<I", data, header + 4)[0] == SHT_VERNEED:
            struct.pack_into("<QQ", data, header + 24, at, len(table))
    exe = root / "usr/bin/hostile"
    exe.parent.mkdir(parents=True, exist_ok=True)
    exe.write_bytes(bytes(data) + bytes(at - len(data)) + table)
    exe.chmod(0o755)
    return root


def scan_root(root: Path) -> object:
    return scan(str(root), ScanOptions(platforms=(Platform.parse("linux/amd64"),)))


def explain_in_root(root: Path) -> object:
    """What the node agent does for an early death: the root's own linker, through RootView."""
    handle = Root(os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC), str(root))
    try:
        view = RootView(handle)
        node = view.node("/usr/bin/hostile")
        assert node is not None and node.elf is not None
        return explain(view, "/usr/bin/hostile", node.elf)
    finally:
        handle.close()


@pytest.mark.parametrize("run_one", [scan_root, explain_in_root])
def test_the_agent_and_scan_finish_in_linear_time(
    tmp_path: Path, run_one: Callable[[Path], object]
) -> None:
    """The report's path: `execwatch scan` of a root, and the node's diagnosis of an early
    death, with the hostile table growing from 64 KiB (8 s before) to 16 MiB."""
    timed = []
    for size in sizes(64 << 10, 16 * MiB):
        root = hostile_root(tmp_path, size)
        start = time.perf_counter()
        with alarm(GIVE_UP):
            run_one(root)
        timed.append((size, time.perf_counter() - start))
        shutil.rmtree(root)
    (first, a), (last, b) = timed[0], timed[-1]
    assert b <= max(a, 0.05) * (last / first) * MARGIN and b < 2.0, timed


# --- ELF headers, program headers, dynamic section (binfmt/elf.py) --------------------------


class CountingFile(io.BytesIO):
    """Counts the bytes the parser reads: its work on the file, deterministic."""

    bytes_read = 0

    def read(self, size: int | None = -1, /) -> bytes:
        data = super().read(size)
        self.bytes_read += len(data)
        return data


def parse_elf(data: bytes) -> object:
    return read_elf(io.BytesIO(data))


def program_headers(count: int) -> bytes:
    """`count` PT_NOTE program headers (each aligned, each pointing at 4 KiB of non-GNU
    notes); past 1,170 (64 KiB, the kernel's limit) the table is refused."""
    phoff, notes_off = 64, 64 + 56 * count
    one = struct.pack("<III", 4, 8, 1) + b"GNU\0" + b"abcdefgh"
    notes = one * (4096 // len(one) + 1)
    head = struct.pack(
        "<16sHHIQQQIHHHHHH", b"\x7fELF\x02\x01\x01" + bytes(9), 2, 62, 1, 0, phoff, 0, 0,
        64, 56, count, 64, 0, 0,
    )  # fmt: skip
    note = struct.pack(
        "<IIQQQQQQ", PT_NOTE, 4, notes_off, BASE + notes_off, BASE + notes_off,
        len(notes), len(notes), 8,
    )  # fmt: skip
    return head + note * count + notes


def repeated_needed(count: int) -> bytes:
    """`count` DT_NEEDED entries naming one library: past 8,192 entries before DT_NULL the
    file is refused (ld.so would read on: what follows would be unknown)."""
    return raw_elf64([(DT["NEEDED"], 1)] * count, b"\0libc.so.6\0")


def distinct_needed(count: int) -> bytes:
    """`count` distinct DT_NEEDED names; past 1,024 the file is refused."""
    names = b"".join(b"lib%d.so\0" % i for i in range(count))
    offsets, at = [], 1
    for i in range(count):
        offsets.append(at)
        at += len(b"lib%d.so\0" % i)
    return raw_elf64([(DT["NEEDED"], o) for o in offsets], b"\0" + names)


def long_dynamic_string(size: int) -> bytes:
    """One DT_NEEDED name `size` bytes long: past PATH_MAX it is refused, whatever its size."""
    return raw_elf64([(DT["NEEDED"], 1)], b"\0" + b"a" * size + b"\0")


def version_chain(count: int) -> bytes:
    """`count` Verneed records of one Vernaux each: past 8,192 records, refused."""
    spec = ElfSpec(needed=["libc.so.6"], verneed=[("libc.so.6", [("GLIBC_2.2.5", 0)])] * count)
    return build_elf(spec).data


def padded_file(size: int) -> bytes:
    """A small valid ELF followed by `size` bytes of nothing: the parser reads a few KiB."""
    return build_elf(ElfSpec(needed=["libc.so.6"])).data + bytes(size)


ELF_FAMILIES: dict[str, tuple[Callable[[int], bytes], list[int]]] = {
    "program-headers": (program_headers, sizes(16, 2048)),
    "repeated-needed": (repeated_needed, sizes(64, 16384)),
    "distinct-needed": (distinct_needed, sizes(16, 2048)),
    "long-dynamic-string": (long_dynamic_string, sizes(256, 16 * MiB)),
    "version-chain": (version_chain, sizes(64, 16384)),
    "padded-file": (padded_file, sizes(4 << 10, 16 * MiB)),
}


@pytest.mark.parametrize("family", sorted(ELF_FAMILIES))
def test_elf_reader_cost_is_linear_and_bounded(family: str) -> None:
    make, steps = ELF_FAMILIES[family]
    runs = grow(make, parse_elf, steps)
    for r in runs:
        assert isinstance(r.outcome, (ElfInfo, BinfmtError)), repr(r.outcome)
    if family != "padded-file":  # the last size of every other family is past a limit
        assert isinstance(runs[-1].outcome, ParseLimitExceeded), repr(runs[-1].outcome)


@pytest.mark.parametrize("family", sorted(ELF_FAMILIES))
def test_elf_reader_bytes_read_are_linear_and_within_budget(family: str) -> None:
    make, steps = ELF_FAMILIES[family]
    counted = []
    for step in steps:
        f = CountingFile(make(step))
        with suppress(BinfmtError):
            read_elf(f)
        assert f.bytes_read <= ELF_LIMITS.max_read_bytes + 64
        counted.append((len(f.getbuffer()), f.bytes_read))
    (first, a), (last, b) = counted[0], counted[-1]
    assert b <= max(a, 4096) * (last / first) * 1.1, counted


def test_a_library_needed_past_the_entry_budget_is_not_dropped() -> None:
    """ld.so reads PT_DYNAMIC up to DT_NULL: a DT_NEEDED after 8,192 other entries is
    loaded. The reader stops at its budget, so the file is refused rather than read as
    needing libc alone (the old reader did, and a missing libhidden.so went unreported)."""
    strtab = b"\0libc.so.6\0libhidden.so\0"
    filler = [(DT["NEEDED"], 1)] * ELF_LIMITS.max_dynamic_entries
    data = raw_elf64([*filler, (DT["NEEDED"], 11)], strtab)
    with pytest.raises(ParseLimitExceeded, match="dynamic entries before DT_NULL"):
        read_elf(io.BytesIO(data))
    within = raw_elf64([*filler[:100], (DT["NEEDED"], 11)], strtab)
    assert read_elf(io.BytesIO(within)).needed == ("libc.so.6", "libhidden.so")


def arm_bad_attributes(size: int) -> bytes:
    """An ARM file whose .ARM.attributes hold `size` bytes of one endless ULEB128."""
    attrs = b"\x80" * size
    vendor = b"aeabi\0" + bytes([1]) + struct.pack("<I", 5 + len(attrs)) + attrs
    blob = b"A" + struct.pack("<I", 4 + len(vendor)) + vendor
    return build_elf(ElfSpec(machine=40, elf_class=1, arm_attributes=blob)).data


def test_damaged_arm_attributes_cost_only_the_variant() -> None:
    """The attributes are optional (Go omits them): up to the 64 KiB read, a damaged
    section is walked in linear time and loses only the variant, not the whole file."""
    runs = grow(arm_bad_attributes, parse_elf, sizes(64, 64 << 10))
    for r in runs:
        assert isinstance(r.outcome, ElfInfo), repr(r.outcome)
        assert r.outcome.platform is not None and r.outcome.platform.variant is None


# --- `#!` lines (binfmt/shebang.py) and x86 ISA notes (binfmt/isa.py) -----------------------


def shebang_head(size: int) -> bytes:
    """A `#!` line of `size` bytes without a newline: the kernel reads 256 of them."""
    return b"#!/bin/sh " + b"x" * size


def isa_notes(size: int) -> bytes:
    """`size` bytes of GNU notes that are not property notes: the reader walks at most
    MAX_NOTE_BYTES of them, as the ELF reader passes it no more."""
    one = struct.pack("<III", 4, 8, 1) + b"GNU\0" + b"abcdefgh"
    return one * (size // len(one))


def parse_isa(data: bytes) -> object:
    return parse_isa_needed(data, True, 64)


def test_shebang_cost_does_not_grow_with_the_file() -> None:
    """The line is cut at 255 bytes, as binfmt_script cuts it, however long the file."""
    runs = grow(shebang_head, parse_shebang, sizes(256, 16 * MiB))
    assert {r.outcome for r in runs} == {Shebang("/bin/sh", "x" * 245, False)}


def test_isa_note_cost_does_not_grow_past_one_segment_read() -> None:
    runs = grow(isa_notes, parse_isa, sizes(64, 16 * MiB))
    assert {r.outcome for r in runs} == {None}
    property_note = (
        struct.pack("<III", 4, 16, 5) + b"GNU\0" + struct.pack("<IIII", 0xC0008002, 4, 4, 0)
    )
    assert parse_isa(property_note) == 4  # x86-64-v3: the reader does read notes
    filled = isa_notes(MAX_NOTE_BYTES).ljust(MAX_NOTE_BYTES, b"\0")  # then an empty note
    assert parse_isa(filled + property_note) is None  # past what the reader looks at
