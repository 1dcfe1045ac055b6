"""An early death whose binary is built to exhaust the library search is reported
Undiagnosed, with the budget that stopped it: never a traceback, never "benign"."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from execwatch.diagnosis.roots import RootLocator
from execwatch.diagnosis.startup import StartupDiagnoser
from execwatch.record import EarlyDeath, Reason
from tests.support.binfmt.elfbuild import ElfSpec, build_elf

DIRS, LIBS = 4096, 9  # 9 names x 4,096 directories: past the 32,768 probes of one search


def build_root(root: Path) -> None:
    """Every library exists, in the last of the ld.so.conf directories: nothing is
    missing before the budget runs out."""
    dirs = [f"/d/{i}" for i in range(DIRS)]
    for d in dirs:
        (root / d.lstrip("/")).mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "etc/ld.so.conf").write_text("\n".join(dirs))
    (root / "lib64").mkdir()
    loader = ElfSpec(interpreter=None, soname="ld-linux-x86-64.so.2")
    (root / "lib64/ld-linux-x86-64.so.2").write_bytes(build_elf(loader).data)
    names = [f"libx{i}.so" for i in range(LIBS)]
    for name in names:
        lib = ElfSpec(interpreter=None, soname=name)
        (root / dirs[-1].lstrip("/") / name).write_bytes(build_elf(lib).data)
    (root / "app").write_bytes(build_elf(ElfSpec(elf_type=2, needed=names)).data)


@pytest.fixture
def chrooted(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """A live task whose root is the tree, as a crash-looping container's would be."""
    root = tmp_path / "root"
    root.mkdir()
    build_root(root)
    pid = os.fork()
    if pid == 0:
        os.chroot(root)
        os.chdir("/")
        time.sleep(60)
        os._exit(0)
    try:
        yield pid, root
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)


def test_a_search_past_its_budget_is_undiagnosed_and_says_why(chrooted: tuple[int, Path]) -> None:
    pid, root = chrooted
    app, top = (root / "app").stat(), root.stat()
    event = EarlyDeath(
        time=time.time(), pid=pid, tgid=pid, ppid=os.getpid(), uid=0, comm="app",
        parent_comm="sh", path="/app", cgroup_id=0,
        mntns=os.stat("/proc/self/ns/mnt").st_ino, syscall="exit_group", exit_code=127,
        exe_ino=app.st_ino, exe_dev=app.st_dev, root_ino=top.st_ino,
    )  # fmt: skip

    started = time.monotonic()
    diagnosis = StartupDiagnoser(RootLocator()).diagnose(event)

    assert diagnosis.reason is Reason.UNDIAGNOSED
    assert diagnosis.detail.startswith("not diagnosed: library search: more than 32768 lookups")
    assert time.monotonic() - started < 10
