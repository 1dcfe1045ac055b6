"""Random mutations of real and built ELF files: only ElfInfo or BinfmtError, fast, bounded reads.

The RNG seed is fixed so a failure reproduces; the loop is bounded by both a count and a time.
"""

from __future__ import annotations

import io
import random
import time
from pathlib import Path

import pytest

from execwatch.binfmt import BinfmtError, parse_shebang, read_elf
from tests.support.binfmt.elfbuild import ElfSpec, arm_attributes, build_elf

INTERESTING = [0, 1, 0x7F, 0x80, 0xFF, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF, 2**63, 2**64 - 1, 2**32]
MAX_READ = 1 << 20


class MeteredBytes(io.BytesIO):
    """Counts bytes handed out, to prove the reader never reads without bound."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.bytes_read = 0

    def read(self, size: int | None = -1) -> bytes:
        data = super().read(size)
        self.bytes_read += len(data)
        return data


def seeds(foreign_root: Path, host_binaries: dict[str, Path]) -> list[bytes]:
    files = [foreign_root / a / "root/usr/bin/hello" for a in ("arm64", "armhf", "s390x", "i386")]
    files += [host_binaries["musl"], host_binaries["uses-foo"], host_binaries["libfoo"]]
    out = [f.read_bytes() for f in files]
    arm = ElfSpec(machine=40, elf_class=1, flags=0x05000400, needed=["libc.so.6"])
    arm.arm_attributes = arm_attributes(10)
    arm.verneed = [("libc.so.6", [("GLIBC_2.4", 0), ("GLIBC_2.34", 2)])]
    out.append(build_elf(arm).data)
    out.append(build_elf(ElfSpec(little=False, needed=["a"], verdef=["x", "V1", "V2"])).data)
    return out


def mutate(rng: random.Random, data: bytes) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 6)):
        hot = min(len(buf), 8192)  # headers, PT_INTERP, dynamic and version tables live here
        kind = rng.random()
        if kind < 0.4:
            buf[rng.randrange(hot)] = rng.randrange(256)
        elif kind < 0.8:
            width = rng.choice([2, 4, 8])
            pos = rng.randrange(max(hot - width, 1))
            value = rng.choice(INTERESTING) % (1 << (8 * width))
            buf[pos : pos + width] = value.to_bytes(width, rng.choice(["little", "big"]))
        else:
            del buf[rng.randrange(1, len(buf)) :]
            if len(buf) < 9:
                break
    return bytes(buf)


@pytest.mark.timeout(120)
def test_mutated_elf_files_only_raise_binfmt_error(
    foreign_root: Path, host_binaries: dict[str, Path]
) -> None:
    rng = random.Random(20260301)
    corpus = seeds(foreign_root, host_binaries)
    outcomes = {"parsed": 0, "refused": 0}
    slowest = 0.0
    deadline = time.monotonic() + 20
    runs = 0
    while runs < 6000 and time.monotonic() < deadline:
        data = mutate(rng, rng.choice(corpus))
        stream = MeteredBytes(data)
        start = time.perf_counter()
        try:
            read_elf(stream)
            outcomes["parsed"] += 1
        except BinfmtError as exc:
            assert "\n" not in str(exc)
            outcomes["refused"] += 1
        slowest = max(slowest, time.perf_counter() - start)
        assert stream.bytes_read <= MAX_READ, f"run {runs} read {stream.bytes_read} bytes"
        runs += 1
    assert runs >= 1000, f"only {runs} runs in the time budget"
    assert outcomes["parsed"] > 0 and outcomes["refused"] > 0, outcomes
    assert slowest < 1.0, f"one parse took {slowest:.2f}s"


@pytest.mark.timeout(60)
def test_random_bytes_after_a_shebang_never_raise() -> None:
    rng = random.Random(7)
    alphabet = b"#! \t\r\n\0/abc"
    for _ in range(20000):
        head = b"#!" + bytes(rng.choice(alphabet) for _ in range(rng.randrange(300)))
        parsed = parse_shebang(head)
        if parsed is not None:
            assert "\n" not in parsed.interpreter
            assert " " not in parsed.interpreter and "\t" not in parsed.interpreter
