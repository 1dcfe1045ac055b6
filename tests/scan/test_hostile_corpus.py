"""Hostile scan inputs from tests/support/scan/hostile_inputs.py: each is scanned or
refused with the right error, within generous bounds of time and traced memory (exact
figures: parser_bench)."""

from __future__ import annotations

from pathlib import Path

import pytest

from execwatch.binfmt import Platform, parse_shebang
from execwatch.runnable.fs import SymlinkLoop
from execwatch.runnable.limits import Limits
from execwatch.runnable.linker import MAX_CONF_DIRS, MAX_CONF_FILES
from execwatch.scan.errors import LimitExceeded, NothingToCheck, ScanInputError
from execwatch.scan.model import ScanReport
from execwatch.scan.runner import ScanOptions, scan
from tests.support.binfmt.hostile_elf import measure
from tests.support.images.imagebuild import Entry, Image, file, oci_layout, symlink
from tests.support.scan.hostile_inputs import CORPUS, include_tree, ld_so_conf_dirs, symlink_chain

SECONDS = 2.0  # a whole scan: layout, layers, checks
PEAK_BYTES = 32 << 20
AMD64 = ScanOptions(platforms=(Platform.parse("linux/amd64"),))

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


def _layer_scan(tmp_path: Path, entries: list[Entry], limits: Limits) -> ScanReport:
    layout = oci_layout(tmp_path / "l", [Image([entries], entrypoint=["/bin/sh"])])
    return scan(str(layout), ScanOptions(platforms=AMD64.platforms, limits=limits))


def test_tar_entries_are_counted_over_all_layers(tmp_path: Path) -> None:
    entries = [file(f"d/{i}", b"", 0o644) for i in range(200)] + [file("bin/sh", b"#!/bin/sh\n")]
    assert _layer_scan(tmp_path / "ok", entries, Limits(max_entries=250)).findings == []
    with pytest.raises(LimitExceeded, match="more than 100 tar entries"):
        _layer_scan(tmp_path / "over", entries, Limits(max_entries=100))


def test_a_symlink_target_longer_than_a_page_is_refused(tmp_path: Path) -> None:
    entries = [file("bin/sh", b"#!/bin/sh\n"), symlink("bin/long", "x/" * 2048)]
    with pytest.raises(LimitExceeded, match="target longer than 4095 bytes"):
        _layer_scan(tmp_path, entries, Limits())


def test_configuration_text_kept_in_memory_is_bounded(tmp_path: Path) -> None:
    """Only *.conf / *.path under etc/ are kept, and at most max_text_bytes of them."""
    conf = [file(f"etc/ld.so.conf.d/{i}.conf", b"/x\n" * 1000, 0o644) for i in range(20)]
    other = [file(f"etc/data/{i}.txt", b"x" * 60_000, 0o644) for i in range(20)]
    entries = [file("bin/sh", b"#!/bin/sh\n"), *conf, *other]
    assert _layer_scan(tmp_path / "ok", entries, Limits(max_text_bytes=70_000)).findings == []
    with pytest.raises(LimitExceeded, match="more than 50000 bytes of"):
        _layer_scan(tmp_path / "over", entries, Limits(max_text_bytes=50_000))


def test_a_16_mib_shebang_line_costs_its_first_256_bytes() -> None:
    head = b"#!" + b" " * (16 << 20)
    outcome, cost = measure(lambda: parse_shebang(head))
    assert outcome is None  # the kernel's answer: ENOEXEC, the name does not fit the buffer
    assert cost.seconds < 0.01 and cost.peak_bytes < 64 << 10
