"""Coverage-guided fuzzing of the binfmt and scan parsers with atheris (libFuzzer).

    python -m tests.binfmt.fuzz_target -runs=N -max_total_time=S CORPUS_DIR...

Run by tests/binfmt/test_coverage_fuzz.py in a subprocess, because libFuzzer owns the
process and exits it. Each input is given to one parser, chosen by its first byte: ELF
(headers, then dynamic symbols and the lookup of its imports in its exports), `#!`, OCI
JSON, ld.so.conf, a layer tar, the notes of a PT_NOTE segment (x86 ISA level; the next byte
picks byte order and class). Besides "only
the parser's own error", every input must stay within PEAK_BYTES of traced Python memory
and SECONDS of time: either failing is a crash, which atheris reports with the input.
"""

from __future__ import annotations

import contextlib
import io
import sys
import time
import tracemalloc

import atheris

with atheris.instrument_imports():
    from execwatch.binfmt import BinfmtError, parse_shebang, read_elf
    from execwatch.binfmt.isa import parse_isa_needed
    from execwatch.binfmt.symbols import DynamicSymbols, SymbolRef, read_dynamic_symbols
    from execwatch.runnable.limits import Limits
    from execwatch.runnable.memory import MemoryFS
    from execwatch.scan.bounded import parse_json
    from execwatch.scan.errors import ScanInputError
    from execwatch.scan.layers import apply_layer

PEAK_BYTES = 16 << 20
SECONDS = 5.0  # instrumentation slows Python 10-20x, CI load more; exact: parser_bench


def _ld_so_conf(data: bytes) -> None:
    from tests.support.scan.hostile_inputs import (
        ld_so_conf_dirs,  # the linker's reader on a one-file image
    )

    ld_so_conf_dirs({"/etc/ld.so.conf": data})


def _symbols(table: DynamicSymbols | None) -> None:
    """The missing-symbol check's use of a table: its imports, looked up in its exports."""
    if table is not None:
        for ref in (*table.imports[:64], SymbolRef(b"malloc", "GLIBC_2.2.5", "libc.so.6")):
            table.defines(ref)


def one_input(data: bytes) -> None:
    if not data:
        return
    selector, body = data[0] % 6, data[1:]
    tracemalloc.reset_peak()
    before = tracemalloc.get_traced_memory()[0]
    start = time.perf_counter()
    try:
        if selector == 0:
            elf = io.BytesIO(b"\x7fELF" + body)
            _symbols(read_dynamic_symbols(elf, read_elf(elf)))
        elif selector == 1:
            parse_shebang(b"#!" + body)
        elif selector == 2:
            parse_json(body, "fuzz.json", Limits())
        elif selector == 3:
            _ld_so_conf(body)
        elif selector == 4:
            apply_layer(MemoryFS(), io.BytesIO(body), "fuzz.tar", Limits(), [0])
        elif selector == 5:
            how = body[0] if body else 0
            parse_isa_needed(body[1:], not how & 1, 32 if how & 2 else 64)
    except (BinfmtError, ScanInputError):
        pass
    elapsed = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1] - before
    if peak > PEAK_BYTES:
        raise AssertionError(f"parser {selector} peaked at {peak} bytes")
    if elapsed > SECONDS:
        raise AssertionError(f"parser {selector} took {elapsed:.3f}s")


def warm_up() -> None:
    """First calls import lazily and fill caches: not the parsers' cost."""
    from tests.support.binfmt.hostile_elf import max_phnum

    for little in (True, False):
        for cls in (b"\x01", b"\x02"):
            head = b"\x7fELF" + cls + (b"\x01" if little else b"\x02") + bytes(58)
            with contextlib.suppress(BinfmtError):
                read_elf(io.BytesIO(head))
    read_elf(io.BytesIO(max_phnum()))
    parse_json(b"{}", "warm-up", Limits())
    _ld_so_conf(b"/usr/lib\n")
    apply_layer(MemoryFS(), io.BytesIO(bytes(1024)), "warm-up", Limits(), [0])


def main() -> None:
    tracemalloc.start()
    warm_up()
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
