"""Hostile scan inputs from tests/scan/corpus.py: each is scanned or refused with the right
error, within generous bounds of time and traced memory (exact figures: parser_bench)."""

from __future__ import annotations

from pathlib import Path

import pytest

from execwatch.binfmt import Platform
from execwatch.scan.errors import LimitExceeded, NothingToCheck, ScanInputError
from execwatch.scan.fs import SymlinkLoop
from execwatch.scan.linker import MAX_CONF_DIRS, MAX_CONF_FILES
from execwatch.scan.model import ScanReport
from execwatch.scan.runner import ScanOptions, scan
from tests.binfmt.corpus import measure
from tests.scan.corpus import CORPUS, include_tree, ld_so_conf_dirs, symlink_chain

SECONDS = 2.0  # a whole scan: layout, layers, checks
PEAK_BYTES = 32 << 20
AMD64 = ScanOptions(platform=Platform.parse("linux/amd64"))

EXPECTED: dict[str, type[BaseException] | type[ScanReport]] = {
    "DT_NEEDED-loop": ScanReport,
    "40-symlink-chain-4KiB-targets": LimitExceeded,
    "ld.so.conf-300-includes": LimitExceeded,
    "index.json-100k-deep": LimitExceeded,
    "index.json-1.9M-values": LimitExceeded,
    "rootfs-2GB-sparse-files": NothingToCheck,
}


def test_the_corpus_is_the_one_specified() -> None:
    assert set(EXPECTED) == set(CORPUS)


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_hostile_scan_input_is_bounded(tmp_path: Path, name: str) -> None:
    target = CORPUS[name](tmp_path / "target")
    outcome, cost = measure(lambda: scan(str(target), AMD64), repeat=1)
    assert isinstance(outcome, EXPECTED[name]), repr(outcome)
    assert "\n" not in str(outcome) if isinstance(outcome, ScanInputError) else True
    assert cost.seconds < SECONDS, f"{name}: {cost.seconds:.3f}s"
    assert cost.peak_bytes < PEAK_BYTES, f"{name}: peak {cost.peak_bytes} bytes"


def test_a_dt_needed_loop_resolves_each_library_once(tmp_path: Path) -> None:
    report = scan(str(CORPUS["DT_NEEDED-loop"](tmp_path / "t")), AMD64)
    assert report.findings == []
    assert report.results[0].stats.executables == 1


def test_a_legal_symlink_chain_resolves_and_a_41st_link_is_a_loop(tmp_path: Path) -> None:
    ok = scan(str(symlink_chain(tmp_path / "ok", links=40, steps=10)), AMD64)
    assert ok.results[0].stats.executables >= 1 and ok.findings == []
    with pytest.raises(SymlinkLoop):
        scan(str(symlink_chain(tmp_path / "loop", links=41, steps=10)), AMD64)


def test_ld_so_conf_includes_are_read_once_each_and_bounded() -> None:
    dirs = ld_so_conf_dirs(include_tree(files=20, dirs_per_file=3))
    assert len(dirs) == 60 == len(set(dirs))  # every file includes all: each read once
    with pytest.raises(LimitExceeded, match=f"more than {MAX_CONF_FILES} files"):
        ld_so_conf_dirs(include_tree(files=MAX_CONF_FILES + 1, dirs_per_file=1))
    with pytest.raises(LimitExceeded, match=f"more than {MAX_CONF_DIRS} directories"):
        ld_so_conf_dirs(include_tree(files=5, dirs_per_file=MAX_CONF_DIRS))


def test_repeated_ld_so_conf_directories_count_once() -> None:
    conf = b"/usr/lib\n" * 7000  # 63 KB, 7,000 lines of one directory
    assert ld_so_conf_dirs({"/etc/ld.so.conf": conf}) == ["/usr/lib"]
