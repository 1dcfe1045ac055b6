"""The binfmt_misc table tells which foreign architectures a node runs silently.

Each case registers Debian's qemu-aarch64-static in a table of its own (a user namespace),
runs Debian's arm64 busybox for real, and reads the table as the agent does: through
/proc/PID/root."""

from __future__ import annotations

from pathlib import Path

import pytest

from execwatch.binfmt.emulation import MAX_ENTRIES, Emulator, parse_entry, read_table
from tests.support.binfmt.emulation import (
    BinfmtNamespace,
    aarch64_entry,
    binfmt_namespace,
    busybox_arm64,
    qemu_aarch64,
)

__all__ = ["binfmt_namespace", "busybox_arm64"]  # fixtures


@pytest.mark.parametrize(("flags", "listed"), [("F", "F"), ("", ""), ("FPC", "FPCO")])
def test_a_registered_qemu_runs_arm64_binaries_and_is_listed(
    binfmt_namespace: BinfmtNamespace, busybox_arm64: Path, flags: str, listed: str
) -> None:
    qemu = qemu_aarch64()
    binfmt_namespace.register(aarch64_entry("qemu-aarch64", qemu, flags))

    ran = binfmt_namespace.run(busybox_arm64, "echo", "emulated")
    table = read_table(binfmt_namespace.table)

    assert (ran.returncode, ran.stdout) == (0, "emulated\n"), ran.stderr
    assert table is not None and table.enabled
    assert table.emulators == (Emulator("qemu-aarch64", "arm64", str(qemu), listed),)
    assert table.foreign("amd64") == table.emulators
    assert table.foreign("arm64") == ()
    assert table.skipped == 0


def test_a_removed_entry_leaves_the_binary_foreign_again(
    binfmt_namespace: BinfmtNamespace, busybox_arm64: Path
) -> None:
    binfmt_namespace.register(aarch64_entry("qemu-aarch64", qemu_aarch64(), "F"))
    binfmt_namespace.write("qemu-aarch64", "-1")

    ran = binfmt_namespace.run(busybox_arm64, "echo", "emulated")
    table = read_table(binfmt_namespace.table)

    assert ran.returncode != 0 and "Exec format error" in ran.stderr
    assert table is not None and table.emulators == ()


def test_a_disabled_entry_or_table_emulates_nothing(
    binfmt_namespace: BinfmtNamespace, busybox_arm64: Path
) -> None:
    binfmt_namespace.register(aarch64_entry("qemu-aarch64", qemu_aarch64(), "F"))
    binfmt_namespace.write("qemu-aarch64", "0")
    table = read_table(binfmt_namespace.table)
    assert table is not None and table.emulators == ()

    binfmt_namespace.write("qemu-aarch64", "1")
    binfmt_namespace.write("status", "0")
    table = read_table(binfmt_namespace.table)
    assert table is not None and not table.enabled
    assert binfmt_namespace.run(busybox_arm64, "true").returncode != 0


def test_entries_that_are_not_elf_emulators_are_left_out(binfmt_namespace: BinfmtNamespace) -> None:
    binfmt_namespace.register(":text:E::txt::/bin/cat:")
    binfmt_namespace.register(r":dos:M::MZ::/bin/false:")

    table = read_table(binfmt_namespace.table)

    assert table is not None
    assert (table.emulators, table.skipped) == ((), 0)


def test_the_table_is_read_within_its_entry_budget(binfmt_namespace: BinfmtNamespace) -> None:
    lines = "".join(f"echo ':e{i}:E::x{i}::/bin/cat:' > register;" for i in range(MAX_ENTRIES + 9))
    done = binfmt_namespace.run("/bin/sh", "-c", f"cd /proc/sys/fs/binfmt_misc && {lines}")
    assert done.returncode == 0, done.stderr
    binfmt_namespace.register(aarch64_entry("zz-qemu-aarch64", qemu_aarch64(), "F"))

    table = read_table(binfmt_namespace.table)

    assert table is not None
    assert table.skipped == 10, "entries past the budget are counted, never read"
    assert table.emulators == ()


def test_no_binfmt_misc_mounted_is_none(tmp_path: Path) -> None:
    assert read_table(tmp_path / "absent") is None
    assert read_table(tmp_path) is None  # a directory without `status` is no table


@pytest.mark.parametrize(
    ("text", "arch"),
    [
        (
            "enabled\ninterpreter /q\nflags: F\noffset 0\nmagic 7f454c4602010100000000000000000002"
            "00f300\nmask ffffffffffffff00fffffffffffffffffeffffff\n",
            "riscv64",
        ),
        (
            "enabled\ninterpreter /q\nflags: \noffset 0\nmagic 7f454c46020201000000000000000000"
            "00020016\nmask ffffffffffffff00fffffffffffffffffffeffff\n",
            "s390x",
        ),
    ],
)
def test_entries_name_the_architecture_their_magic_selects(text: str, arch: str) -> None:
    emulator = parse_entry("q", text)
    assert emulator is not None and emulator.arch == arch


@pytest.mark.parametrize(
    "text",
    [
        "disabled\ninterpreter /q\nmagic 7f454c4602010100000000000000000002\n",
        "enabled\ninterpreter /q\noffset 0\nmagic 7f454c46\nmask ffffffff\n",  # any ELF
        "enabled\ninterpreter /q\noffset 0\nmagic 7f454c46020101000000000000000000020"
        "0b700\nmask ffffffffffffff00fffffffffffffffffeff0000\n",  # machine not matched
        "enabled\ninterpreter /q\noffset 4\nmagic 7f454c46\n",
        "enabled\ninterpreter /q\nmagic zz\n",
        "",
    ],
)
def test_entries_that_select_no_single_architecture_are_not_emulators(text: str) -> None:
    assert parse_entry("q", text) is None
