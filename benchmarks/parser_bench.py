"""Time and peak memory of every tenant-data parser, per input: the hostile corpora and real
binaries, execwatch against pyelftools (the library's own full reader) in the same run.

    .venv/bin/python -m benchmarks.parser_bench [--repeat N]
    .venv/bin/python -m benchmarks.parser_bench --only reproductions [--old-symbols FILE]

Per input: best wall time of N parses; peak traced Python memory (tracemalloc, one parse);
peak RSS growth of a fresh subprocess parsing it once, over its high-water mark after
imports (what the agent's cgroup sees, C allocations included; 0 = no new peak).
pyelftools runs in a subprocess with a 10 s timeout and a 2 GiB address-space limit.
Scan inputs (OCI layouts, JSON, ld.so.conf trees, symlink chains, sparse files) are
scanned end to end. Target: any input up to 16 MiB within 50 ms and
16 MiB of extra memory. Results go to .cache/bench/parser_bench.json.

The reproductions of issue 24 (symbol versions: a 66 KB Verneed table and a 2 MiB file,
tests/binfmt/test_scaling.py) are parsed by binfmt/symbols.py in a fresh process each:
time, RSS growth, and traced peak. `--old-symbols FILE` runs another copy of the module
beside it, e.g. `git show HEAD:src/execwatch/binfmt/symbols.py > /tmp/old_symbols.py`.
"""

from __future__ import annotations

import argparse
import io
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.support.binfmt.hostile_elf import CORPUS as ELF_CORPUS
from tests.support.binfmt.hostile_elf import measure, sparse_elf
from tests.support.scan.hostile_inputs import CORPUS as SCAN_CORPUS

import execwatch.binfmt.symbols
from benchmarks.common import save
from execwatch.binfmt import Platform, read_elf
from execwatch.binfmt.symbols import read_dynamic_symbols
from execwatch.scan.runner import ScanOptions, scan

TARGET_SECONDS = 0.050
TARGET_BYTES = 16 << 20
REAL = [
    "/usr/lib/x86_64-linux-gnu/libc.so.6",
    "/usr/lib/x86_64-linux-gnu/libstdc++.so.6",
    "/usr/lib/x86_64-linux-gnu/libLLVM-15.so.1",
    "/usr/bin/python3.11",
]

RSS_CHILD = """
import io, json, resource, sys, time
parser, path = sys.argv[1], sys.argv[2]
data = open(path, "rb").read() if parser != "execwatch-file" else None
if parser.startswith("execwatch"):
    from execwatch.binfmt import BinfmtError, read_elf
    def parse():
        try:
            if data is None:
                with open(path, "rb") as f:
                    return read_elf(f)
            return read_elf(io.BytesIO(data))
        except BinfmtError as exc:
            return exc
else:
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile
    from elftools.elf.gnuversions import GNUVerDefSection, GNUVerNeedSection
    def parse():
        try:
            elf = ELFFile(io.BytesIO(data))
            out = []
            for seg in elf.iter_segments():
                if seg["p_type"] == "PT_INTERP":
                    out.append(seg.get_interp_name())
                if seg["p_type"] == "PT_DYNAMIC":
                    for tag in seg.iter_tags():
                        for key in ("needed", "rpath", "runpath", "soname"):
                            if hasattr(tag, key):
                                out += getattr(tag, key).split(":")
            for sec in elf.iter_sections():
                if isinstance(sec, (GNUVerNeedSection, GNUVerDefSection)):
                    for _, aux in sec.iter_versions():
                        out += [a.name for a in aux]
            return out
        except (ELFError, Exception) as exc:
            return exc
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
result = parse()
seconds = time.perf_counter() - start
grow = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base
print(json.dumps({"seconds": seconds, "rss_kib": grow,
                  "outcome": type(result).__name__}))
"""


def child(parser: str, path: Path) -> dict[str, object]:
    """One parse in a fresh interpreter: its time and RSS growth, or what stopped it."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    try:
        out = subprocess.run(
            [sys.executable, "-c", RSS_CHILD, parser, str(path)],
            capture_output=True, text=True, timeout=10, preexec_fn=limit,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"outcome": "timeout (10 s)"}
    if out.returncode != 0:
        last = out.stderr.strip().splitlines()[-1:] or ["?"]
        return {"outcome": f"died: {last[0][:60]}"}
    result: dict[str, object] = json.loads(out.stdout)
    return result


def bench_elf(name: str, data: bytes | None, path: Path, repeat: int) -> dict[str, object]:
    if data is None:

        def parse() -> object:
            with open(path, "rb") as f:
                return read_elf(f)
    else:
        blob = data

        def parse() -> object:
            return read_elf(io.BytesIO(blob))

    outcome, cost = measure(parse, repeat)
    rss = child("execwatch-file" if data is None else "execwatch", path)
    base: dict[str, object] = {"outcome": "not run (2 GB)"}
    if data is not None:
        base = child("pyelftools", path)
    return {
        "input": name,
        "bytes": path.stat().st_size,
        "outcome": type(outcome).__name__,
        "ms": round(cost.seconds * 1000, 3),
        "peak_kib": cost.peak_bytes // 1024,
        "rss_kib": rss.get("rss_kib"),
        "pyelftools_ms": _ms(base),
        "pyelftools_rss_kib": base.get("rss_kib"),
        "pyelftools_outcome": base.get("outcome"),
    }


def _ms(result: dict[str, object]) -> float | None:
    seconds = result.get("seconds")
    return round(float(seconds) * 1000, 3) if isinstance(seconds, (int, float)) else None


def bench_symbols(name: str, data: bytes, repeat: int) -> dict[str, object]:
    """read_dynamic_symbols (the missing-symbol check's reader) after read_elf."""
    info = read_elf(io.BytesIO(data))
    outcome, cost = measure(lambda: read_dynamic_symbols(io.BytesIO(data), info), repeat)
    result = "unknown (None)" if outcome is None else type(outcome).__name__
    return {"input": name, "bytes": len(data), "outcome": result,
            "ms": round(cost.seconds * 1000, 3), "peak_kib": cost.peak_bytes // 1024}  # fmt: skip


REPRODUCTION_CHILD = """
import importlib.util, io, json, resource, sys, time, tracemalloc
module_path, case = sys.argv[1], sys.argv[2]
spec = importlib.util.spec_from_file_location("symbols_under_bench", module_path)
symbols = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = symbols
spec.loader.exec_module(symbols)
from execwatch.binfmt import BinfmtError, read_elf
from tests.support.binfmt.version_tables import verdef_long_name, verneed_shared_chain
data = {"verneed-66KB": lambda: verneed_shared_chain(66 << 10),
        "file-2MiB": lambda: verdef_long_name(2 << 20)}[case]()
info = read_elf(io.BytesIO(data))
def parse():
    try:
        table = symbols.read_dynamic_symbols(io.BytesIO(data), info)
        return "unknown (None)" if table is None else f"table, {len(table.imports)} imports"
    except BinfmtError as exc:
        return f"{type(exc).__name__}: {exc}"
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start, cpu = time.perf_counter(), time.process_time()
outcome = parse()
seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
grow = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base
peak = None
if seconds < 1.0:  # tracemalloc slows a Python loop tenfold
    tracemalloc.start()
    parse()
    peak = tracemalloc.get_traced_memory()[1] // 1024
print(json.dumps({"bytes": len(data), "seconds": seconds, "cpu_seconds": cpu, "rss_kib": grow,
                  "peak_kib": peak, "outcome": outcome}))
"""


def bench_reproductions(old: Path | None) -> list[dict[str, object]]:
    """The reported symbol-version inputs, each in a fresh process, now (and before)."""
    modules = {"now": Path(execwatch.binfmt.symbols.__file__)}
    if old is not None:
        modules["before"] = old
    rows: list[dict[str, object]] = []
    for case in ("verneed-66KB", "file-2MiB"):
        for when, module in modules.items():
            out = subprocess.run(
                [sys.executable, "-c", REPRODUCTION_CHILD, str(module), case],
                capture_output=True, text=True, timeout=600, cwd=Path(__file__).parents[1],
            )  # fmt: skip
            if out.returncode != 0:
                rows.append({"input": case, "code": when, "outcome": out.stderr[-200:]})
                continue
            rows.append({"input": case, "code": when, **json.loads(out.stdout)})
    return rows


def _print_reproductions(rows: list[dict[str, object]]) -> None:
    print("\n| symbol-version input | code | bytes | result | ms | CPU ms | RSS growth KiB "
          "| peak KiB (traced) |")  # fmt: skip
    print("|---|---|---:|---|---:|---:|---:|---:|")
    for r in rows:
        ms, cpu = (round(float(str(r.get(k, "nan"))) * 1000, 1) for k in ("seconds", "cpu_seconds"))
        print(f"| {r['input']} | {r['code']} | {r.get('bytes', 0):,} | {r['outcome']} | {ms} "
              f"| {cpu} | {r.get('rss_kib')} | {r.get('peak_kib')} |")  # fmt: skip


def bench_scan(name: str, target: Path) -> dict[str, object]:
    options = ScanOptions(platforms=(Platform.parse("linux/amd64"),))
    outcome, cost = measure(lambda: scan(str(target), options), repeat=3)
    return {
        "input": name,
        "outcome": type(outcome).__name__,
        "ms": round(cost.seconds * 1000, 3),
        "peak_kib": cost.peak_bytes // 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--only", choices=["reproductions"], help="only the issue-24 inputs")
    parser.add_argument("--old-symbols", type=Path, metavar="FILE",
                        help="another copy of binfmt/symbols.py to run on them too")  # fmt: skip
    args = parser.parse_args()
    reproductions = bench_reproductions(args.old_symbols)
    _print_reproductions(reproductions)
    if args.only == "reproductions":
        path = save("parser_bench_reproductions", {"reproductions": reproductions})
        print(f"saved {path}")
        return
    elf_rows, scan_rows, symbol_rows = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name, make in ELF_CORPUS.items():
            data = make()
            path = work / name
            path.write_bytes(data)
            elf_rows.append(bench_elf(name, data, path, args.repeat))
        sparse = sparse_elf(work / "sparse")
        elf_rows.append(bench_elf("2GB-sparse-file", None, sparse, args.repeat))
        sparse.unlink()
        symbol_rows.append(
            bench_symbols("dynsym-suffix-bomb", ELF_CORPUS["dynsym-suffix-bomb"](), args.repeat)
        )
        for real in REAL:
            path = Path(real).resolve()
            if path.exists():
                elf_rows.append(bench_elf(real, path.read_bytes(), path, args.repeat))
                symbol_rows.append(bench_symbols(real, path.read_bytes(), args.repeat))
        for name, build in SCAN_CORPUS.items():
            scan_rows.append(bench_scan(name, build(work / f"scan-{name}")))
    _print(elf_rows, scan_rows)
    print("\n| dynamic symbols of | bytes | result | ms | peak KiB (traced) |")
    print("|---|---:|---|---:|---:|")
    for r in symbol_rows:
        print(f"| {r['input']} | {r['bytes']:,} | {r['outcome']} | {r['ms']} | {r['peak_kib']:,} |")
    over = [
        r["input"]
        for r in elf_rows
        if int(str(r["bytes"])) <= TARGET_BYTES
        and (float(str(r["ms"])) > TARGET_SECONDS * 1000 or int(str(r["peak_kib"])) > 16 << 10)
    ]
    print(f"ELF inputs <= 16 MiB over the 50 ms / 16 MiB target: {over or 'none'}")
    path = save(
        "parser_bench",
        {
            "elf": elf_rows,
            "symbols": symbol_rows,
            "scan": scan_rows,
            "over_target": over,
            "reproductions": reproductions,
        },
    )
    print(f"saved {path}")


def _print(elf_rows: list[dict[str, object]], scan_rows: list[dict[str, object]]) -> None:
    print("| ELF input | bytes | result | ms | peak KiB (traced) | RSS growth KiB "
          "| pyelftools ms | pyelftools RSS growth KiB |")  # fmt: skip
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    for r in elf_rows:
        print(f"| {r['input']} | {r['bytes']:,} | {r['outcome']} | {r['ms']} | {r['peak_kib']:,} "
              f"| {r['rss_kib']} | {r['pyelftools_ms']} | {r['pyelftools_rss_kib']} |")  # fmt: skip
    print()
    print("| scan input | result | ms | peak KiB (traced) |")
    print("|---|---|---:|---:|")
    for r in scan_rows:
        print(f"| {r['input']} | {r['outcome']} | {r['ms']} | {r['peak_kib']:,} |")


if __name__ == "__main__":
    main()
