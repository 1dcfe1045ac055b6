"""The hostile ELF corpus: each file is refused or parsed within a bounded time and memory.

Bounds here are generous (the machine is shared): 250 ms and 16 MiB of traced Python
memory per file, against a target of 50 ms; benchmarks/parser_bench.py gives exact figures.
A subprocess checks the same corpus against its peak RSS, which tracemalloc cannot see.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from execwatch.binfmt import BinfmtError, ElfInfo, read_elf
from execwatch.binfmt.errors import ParseLimitExceeded, TruncatedFile
from execwatch.binfmt.symbols import (
    FREE_STEPS,
    MAX_AVERAGE_STEPS,
    SymbolRef,
    read_dynamic_symbols,
)
from tests.support.binfmt.hostile_elf import CORPUS, SYMBOL_CORPUS, measure, sparse_elf

SECONDS = 0.25
PEAK_BYTES = 16 << 20

EXPECTED: dict[str, type[BaseException] | type[ElfInfo]] = {
    "string-reuse-bomb": ElfInfo,
    "string-offsets-bomb": ParseLimitExceeded,
    "8189-distinct-needed": ParseLimitExceeded,
    "huge-e_phnum": ParseLimitExceeded,
    "max-e_phnum": ElfInfo,
    "huge-e_shnum-arm": ElfInfo,
    "verneed-chain": ParseLimitExceeded,
    "verdef-chain": ParseLimitExceeded,
    "overlapping-tables": BinfmtError,
    "16MiB-unterminated-string": BinfmtError,
    "dynsym-suffix-bomb": ElfInfo,
    "1170-note-segments": ElfInfo,
}


def test_the_corpus_is_the_one_specified() -> None:
    assert set(EXPECTED) == set(CORPUS)


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_hostile_elf_is_bounded(name: str) -> None:
    data = CORPUS[name]()
    assert len(data) <= 16 << 20
    outcome, cost = measure(lambda: read_elf(io.BytesIO(data)))
    assert isinstance(outcome, EXPECTED[name]), repr(outcome)
    assert cost.seconds < SECONDS, f"{name}: {cost.seconds:.3f}s"
    assert cost.peak_bytes < PEAK_BYTES, f"{name}: peak {cost.peak_bytes} bytes"


def test_the_string_reuse_bomb_keeps_each_directory_once() -> None:
    """8188 entries naming one "ab:ab:…" string: one directory, as ld.so would search it."""
    info = read_elf(io.BytesIO(CORPUS["string-reuse-bomb"]()))
    assert info.rpath == ("ab",) and info.runpath == ("ab",)
    assert len(info.needed) == 1


def test_a_2gb_sparse_file_costs_a_few_reads(tmp_path: Path) -> None:
    path = sparse_elf(tmp_path / "sparse")
    assert path.stat().st_size == 2 << 30

    def parse() -> ElfInfo:
        with open(path, "rb") as f:
            return read_elf(f)

    outcome, cost = measure(parse)
    assert isinstance(outcome, ElfInfo) and outcome.needed == ("libc.so.6",)
    assert cost.seconds < SECONDS and cost.peak_bytes < 1 << 20


def test_truncation_and_hostility_are_told_apart() -> None:
    data = CORPUS["string-reuse-bomb"]()
    with pytest.raises(TruncatedFile):
        read_elf(io.BytesIO(data[:1000]))
    with pytest.raises(ParseLimitExceeded, match="more than 1024 DT_NEEDED libraries"):
        read_elf(io.BytesIO(CORPUS["8189-distinct-needed"]()))


RSS_PROBE = """
import io, json, resource, sys
from execwatch.binfmt import BinfmtError, read_elf
from execwatch.binfmt.symbols import SymbolRef, read_dynamic_symbols
from tests.support.binfmt.hostile_elf import CORPUS, SYMBOL_CORPUS
blobs = {name: make() for name, make in CORPUS.items()}
tables = [make() for make in SYMBOL_CORPUS.values()]
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
for name, data in blobs.items():
    try:
        read_elf(io.BytesIO(data))
    except BinfmtError:
        pass
for data in tables:
    elf = io.BytesIO(data)
    table = read_dynamic_symbols(elf, read_elf(elf))
    [table.defines(SymbolRef(f"s{i}".encode(), None, None)) for i in range(1000)]
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"growth_kib": peak - base}))
"""


def test_peak_rss_over_the_whole_corpus() -> None:
    """RSS sees what tracemalloc does not (C allocations, arenas); 32 MiB of growth at most."""
    out = subprocess.run(
        [sys.executable, "-c", RSS_PROBE], capture_output=True, text=True, check=True,
        cwd=Path(__file__).parents[2],
    )  # fmt: skip
    growth = json.loads(out.stdout)["growth_kib"]
    assert growth < 32 << 10, f"RSS grew by {growth} KiB"


@pytest.mark.parametrize("shoff", [1 << 63, (1 << 64) - 1])
def test_a_section_table_past_any_seekable_offset_is_unknown_not_a_crash(shoff: int) -> None:
    """Found by the coverage fuzzer: an e_shoff that no seek can reach raised OverflowError."""
    data = bytearray(Path("/bin/true").read_bytes())
    data[0x28:0x30] = shoff.to_bytes(8, "little")
    elf = io.BytesIO(bytes(data))
    assert read_dynamic_symbols(elf, read_elf(elf)) is None


def look_up(data: bytes, names: list[bytes]) -> list[bool | None]:
    """What the missing-symbol check does with a provider: read it, ask for each name."""
    elf = io.BytesIO(data)
    table = read_dynamic_symbols(elf, read_elf(elf))
    assert table is not None
    return [table.defines(SymbolRef(name, None, None)) for name in names]


LOOKUPS = [b"a", *(f"s{i}".encode() for i in reversed(range(1000))), b"x" * 4000]


@pytest.mark.parametrize("name", sorted(SYMBOL_CORPUS))
def test_hostile_hash_table_is_bounded(name: str) -> None:
    """A chain without an end, a chain loop, lying counts: each lookup walks at most
    MAX_CHAIN_STEPS entries, and an object MAX_AVERAGE_STEPS per lookup past FREE_STEPS;
    then it answers unknown."""
    data = SYMBOL_CORPUS[name]()
    assert len(data) <= 16 << 20
    outcome, cost = measure(lambda: look_up(data, LOOKUPS))
    assert isinstance(outcome, list), repr(outcome)
    assert cost.seconds < SECONDS, f"{name}: {cost.seconds:.3f}s"
    assert cost.peak_bytes < PEAK_BYTES, f"{name}: peak {cost.peak_bytes} bytes"
    if name == "gnu-hash-long-chains":  # real names, found until the walking budget is spent
        found = outcome.index(None)
        assert outcome[1:found] == [True] * (found - 1)
        walked = sum(1000 - i for i in range(found - 1))  # s999 first: 1,000 entries
        assert walked <= FREE_STEPS + MAX_AVERAGE_STEPS * found + 1000
        assert set(outcome[found:]) == {None}
    else:
        assert set(outcome) == {None}, outcome[:5]
