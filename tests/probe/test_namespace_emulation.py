"""Emulation in any namespace's binfmt_misc (Linux 6.7+: one table per user namespace).

The probe runs as `execwatch trace` runs it on a host, with its own root and this host's
table (none mounted here). A user namespace then mounts a binfmt_misc of its own and
registers Debian's qemu-aarch64-static there with the F flag, as a rootless builder does:
the kernel counts the mount, the probe finds that table through /proc, reads it in the
namespace's own root, and only then attaches the emulation program. Before that, no exec
runs it: bpftool shows no link to it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from execwatch.node.stack import StackOptions
from execwatch.pipeline import PipelineOptions
from execwatch.probe import Probe
from execwatch.probe.loader import EMULATION_PROGRAM, ProbeOptions
from execwatch.probe.nsbinfmt import binfmt_mounts, find_tables
from execwatch.record import ExecFailure, Reason
from tests.support.binfmt.emulation import (
    TABLE_IN_NAMESPACE,
    BinfmtNamespace,
    aarch64_entry,
    busybox_arm64,
    qemu_aarch64,
)
from tests.support.node.stack_runner import node_stack
from tests.support.wait import wait_until

__all__ = ["busybox_arm64"]  # fixture

REGISTER = f"printf '%s' \"$1\" > {TABLE_IN_NAMESPACE}/register"
NEVER = 3600.0  # a periodic re-read that never comes within a test


def prog_id(fd: int) -> int:
    for line in Path(f"/proc/self/fdinfo/{fd}").read_text().splitlines():
        if line.startswith("prog_id:"):
            return int(line.split()[1])
    raise AssertionError(f"fd {fd} is no BPF program")


def linked_programs() -> set[int]:
    """Program ids of every BPF link on this host, as bpftool lists them."""
    out = subprocess.run(["bpftool", "link", "show", "-j"], check=True, capture_output=True)
    return {int(link["prog_id"]) for link in json.loads(out.stdout)}


@pytest.fixture
def host_probe() -> Iterator[Probe]:
    """The probe with the host's root and table, and no periodic re-read within the test:
    only the kernel's count of binfmt_misc mounts makes it look for a new table."""
    with Probe(ProbeOptions(binfmt_refresh_s=NEVER)) as probe:
        assert probe.emulation.supported, probe.emulation.unsupported
        yield probe


def test_the_program_stays_unattached_until_a_namespace_mounts_and_registers_qemu(
    host_probe: Probe,
) -> None:
    emulation = prog_id(host_probe.program_fds()[EMULATION_PROGRAM])
    exit_execve = prog_id(host_probe.program_fds()["exit_execve"])
    host_probe.refresh_emulators(force=False)
    assert exit_execve in linked_programs(), "bpftool sees the probe's links"
    assert emulation not in linked_programs(), "no exec runs the emulation program"
    assert not host_probe.emulation_attached and host_probe.binfmt_mounts() == 0

    line = aarch64_entry("qemu-aarch64", qemu_aarch64(), "F")
    ns = BinfmtNamespace.start(REGISTER, line)  # mounted, then registered, in the namespace
    try:
        assert host_probe.binfmt_mounts() == 1, "the kernel counted the namespace's mount"
        host_probe.refresh_emulators(force=False)  # not due: only the count moved

        assert host_probe.emulation_attached and emulation in linked_programs()
        assert host_probe.binfmt_emulators() == (), "the node's table has none"
        [emu] = host_probe.namespace_emulators()
        assert (emu.arch, emu.interpreter, emu.flags) == ("arm64", str(qemu_aarch64()), "F")
    finally:
        ns.stop()
    host_probe.refresh_emulators()  # its process is gone: the table with it
    assert not host_probe.emulation_attached and emulation not in linked_programs()


def test_a_namespace_mount_without_a_foreign_entry_leaves_the_program_unattached(
    host_probe: Probe,
) -> None:
    ns = BinfmtNamespace.start()
    try:
        host_probe.refresh_emulators(force=False)
        assert host_probe.binfmt_mounts() == 1
        assert [t.pid for t in host_probe.ns_binfmt.tables] == [ns.process.pid]
        assert not host_probe.emulation_attached
    finally:
        ns.stop()


FSOPEN = 430  # the new mount API's first step (x86_64 and arm64 alike)


def test_a_binfmt_misc_opened_through_the_new_mount_api_is_counted(host_probe: Probe) -> None:
    """fsopen("binfmt_misc") in a user namespace (util-linux 2.39+ mounts this way)."""
    script = (
        "import ctypes, sys; libc = ctypes.CDLL(None, use_errno=True);"
        f" fd = libc.syscall({FSOPEN}, b'binfmt_misc', 0);"
        " sys.exit(0 if fd >= 0 else ctypes.get_errno())"
    )
    unshare = ["unshare", "-U", "-m", "-r", "--propagation", "private"]
    done = subprocess.run([*unshare, sys.executable, "-c", script], capture_output=True)
    tmpfs = script.replace("binfmt_misc", "tmpfs")
    other = subprocess.run([*unshare, sys.executable, "-c", tmpfs], capture_output=True)

    assert (done.returncode, other.returncode) == (0, 0), done.stderr
    assert host_probe.binfmt_mounts() == 1, "binfmt_misc counted, tmpfs not"
    host_probe.refresh_emulators(force=False)
    assert host_probe.ns_binfmt.stale, "not attached yet: the next periodic read looks again"


def test_an_arm64_run_through_a_namespaces_own_qemu_is_reported_emulated_on_the_host(
    busybox_arm64: Path,
) -> None:
    """The node stack as `execwatch trace` runs it; the namespace mounts its table, then
    registers qemu while the probe runs."""
    qemu = qemu_aarch64()
    records: list[ExecFailure] = []
    options = StackOptions(
        probe=ProbeOptions(binfmt_refresh_s=0.5),
        pipeline=PipelineOptions(window=2.0),
    )
    with node_stack(options, records.append, loop="run") as running:
        probe = running.probe
        assert not probe.emulation_attached
        ns = BinfmtNamespace.start()
        try:
            ns.register(aarch64_entry("qemu-aarch64", qemu, "F"))
            wait_until(lambda: probe.emulation_attached, 10.0, explain=lambda: "not attached")
            ran = ns.run(busybox_arm64, "echo", "emulated")

            def found() -> ExecFailure | None:
                return next((r for r in records if r.event.path == str(busybox_arm64)), None)

            record: ExecFailure = wait_until(
                found, 10.0, explain=lambda: f"saw {[r.event.path for r in records]}"
            )
        finally:
            ns.stop()

    assert (ran.returncode, ran.stdout) == (0, "emulated\n")
    assert record.diagnosis.reason is Reason.EMULATED
    assert record.diagnosis.interpreter == str(qemu)
    assert record.diagnosis.binary_arch == "arm64"
    assert record.event.status == "EMULATED"


def test_mountinfo_lines_give_each_binfmt_misc_superblock_and_its_unescaped_mount_point() -> None:
    mountinfo = (
        "22 1 0:21 / /proc rw,nosuid - proc proc rw\n"
        "40 22 0:45 / /proc/sys/fs/binfmt_misc rw shared:7 - binfmt_misc binfmt_misc rw\n"
        r"41 30 0:46 / /tmp/a\040b rw - binfmt_misc none rw" + "\n"
        "garbage line\n"
        "42 30 0:47 / /x rw - tmpfs binfmt_misc rw\n"
    )
    assert binfmt_mounts(mountinfo) == [
        (os.makedev(0, 45), "/proc/sys/fs/binfmt_misc"),
        (os.makedev(0, 46), "/tmp/a b"),
    ]


def fake_proc(tmp_path: Path, processes: dict[int, tuple[str, str]]) -> Path:
    """A /proc of `processes`: pid -> (mount namespace name, mountinfo). Processes of one
    namespace share its ns/mnt inode (a hard link), as the kernel's nsfs gives."""
    proc, namespaces = tmp_path / "proc", tmp_path / "ns"
    namespaces.mkdir()
    for pid, (ns, mountinfo) in processes.items():
        (proc / str(pid) / "ns").mkdir(parents=True)
        (namespaces / ns).touch()
        os.link(namespaces / ns, proc / str(pid) / "ns" / "mnt")
        (proc / str(pid) / "mountinfo").write_text(mountinfo)
    return proc


def test_a_scan_keeps_each_binfmt_misc_superblock_once_and_never_the_nodes(
    tmp_path: Path,
) -> None:
    node = "40 22 0:45 / /proc/sys/fs/binfmt_misc rw - binfmt_misc binfmt_misc rw\n"
    own = "41 30 0:46 / /proc/sys/fs/binfmt_misc rw - binfmt_misc binfmt_misc rw\n"
    shown_twice = "52 30 0:46 / /mnt/again rw - binfmt_misc binfmt_misc rw\n"
    proc = fake_proc(
        tmp_path,
        {
            1: ("host", node),
            7: ("builder", own),
            8: ("builder", "99 30 0:99 / /x rw - binfmt_misc none rw\n"),  # its ns was read
            9: ("child", shown_twice),
        },
    )
    tables = find_tables(frozenset({os.makedev(0, 45)}), proc)
    assert [(t.pid, t.mountpoint, t.dev) for t in tables] == [
        (7, "/proc/sys/fs/binfmt_misc", os.makedev(0, 46))
    ]
    assert tables[0].mntns == os.stat(proc / "7" / "ns" / "mnt").st_ino
