"""`python -m benchmarks [NAME ...]` (`make bench`): run every benchmark, or the named ones.

Each benchmark also runs alone as `python -m benchmarks.NAME`; they run here one after
another with their default arguments, and a failing one does not stop the others.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHMARKS = sorted(p.stem for p in HERE.glob("*_bench.py"))  # every benchmark module


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help=f"any of {', '.join(BENCHMARKS)} (default: all)")  # fmt: skip
    names = parser.parse_args().names or BENCHMARKS
    unknown = sorted(set(names) - set(BENCHMARKS))
    if unknown:
        parser.error(f"unknown benchmark {', '.join(unknown)} (have: {', '.join(BENCHMARKS)})")
    failed = []
    for name in names:
        print(f"\n=== {name} ===", flush=True)
        started = time.perf_counter()
        module = importlib.import_module(f"benchmarks.{name}")
        sys.argv = [f"benchmarks.{name}"]  # each parses its own (default) arguments
        try:
            code = module.main()
        except SystemExit as exc:
            code = exc.code
        if (isinstance(code, int) and code != 0) or isinstance(code, str):
            failed.append(name)
            print(f"{name} failed: {code}", file=sys.stderr)
        print(f"=== {name}: {time.perf_counter() - started:.0f} s ===", flush=True)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
