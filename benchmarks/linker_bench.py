"""The library search on its worst input: a 34 KB ELF with 1,024 missing DT_NEEDED names in
a root whose ld.so.conf names 4,096 directories (the security review's reproduction).

    .venv/bin/python -m benchmarks.linker_bench [--root DIR] [--tracemalloc]

Runs the node's diagnosis (`diagnosis.startup.explain` over a live `RootView`) and the
scanner's linker on the same root, and prints wall time, peak RSS (and with
--tracemalloc the peak of traced memory), the linker's work counters and the finding.
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time
import tracemalloc
from pathlib import Path

from tests.support.binfmt.elfbuild import ElfSpec, build_elf

from execwatch.diagnosis.startup import explain
from execwatch.runnable.directory import DirectoryFS
from execwatch.runnable.linker import Linker
from execwatch.runnable.liveroot import RootView
from execwatch.runnable.openat2 import Root

NAMES, DIRS = 1024, 4096


def build(root: Path) -> None:
    if (root / "app").exists():
        return
    dirs = [f"/d/{j}" for j in range(DIRS)]
    for d in dirs:
        (root / d.lstrip("/")).mkdir(parents=True, exist_ok=True)
    (root / "lib64").mkdir(exist_ok=True)
    loader = ElfSpec(interpreter=None, soname="ld-linux-x86-64.so.2")
    (root / "lib64/ld-linux-x86-64.so.2").write_bytes(build_elf(loader).data)
    (root / "etc").mkdir(exist_ok=True)
    (root / "etc/ld.so.conf").write_text("\n".join(dirs))
    needed = [f"libmissing{i}.so" for i in range(NAMES)]
    (root / "app").write_bytes(build_elf(ElfSpec(elf_type=2, needed=needed)).data)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.linker_bench", description=__doc__)
    parser.add_argument("--root", type=Path, help="where to build the tree (default: a temp dir)")
    parser.add_argument("--tracemalloc", action="store_true", help="also trace Python memory")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = args.root or Path(tmp)
        build(root)
        if args.tracemalloc:
            tracemalloc.start()
        fd = os.open(root, os.O_PATH | os.O_DIRECTORY)
        view = RootView(Root(fd, str(root)))
        info = view.node("/app").elf  # type: ignore[union-attr]
        assert info is not None
        started = time.perf_counter()
        finding = explain(view, "/app", info)
        seconds = time.perf_counter() - started
        traced = tracemalloc.get_traced_memory()[1] if args.tracemalloc else 0
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        linker = Linker(DirectoryFS(str(root)), {})
        started = time.perf_counter()
        result = linker.resolve("/app", info, "glibc")
        scan_seconds = time.perf_counter() - started
    print(f"input: {NAMES} missing names x {DIRS} ld.so.conf directories")
    print(f"node explain(): {seconds:.2f} s, peak RSS {rss:.1f} MiB"
          + (f", traced peak {traced / 2**20:.1f} MiB" if args.tracemalloc else ""))  # fmt: skip
    print(f"finding: {finding}")
    work = linker.work
    print(f"scan linker: {scan_seconds:.2f} s, probes {work.probes}, steps {work.steps}, "
          f"bytes {work.bytes}; {len(result.missing)} missing")  # fmt: skip
    print(f"incomplete: {result.incomplete}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
