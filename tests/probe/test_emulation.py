"""A foreign binary that does not fail: on a node whose binfmt_misc table runs arm64 ELF
files through user-mode QEMU, its exec succeeds, and the probe reports it as Emulated.

Each case registers Debian's qemu-aarch64-static in a table of its own (a user namespace:
Linux 6.7+), runs Debian's arm64 busybox for real, and runs the real node stack (probe,
pipeline, diagnosis, metrics) on this kernel, reading that table as the agent reads the
node's: through the namespace's root (`host_root`, the DaemonSet's /proc/1/root). The last
cases are the DaemonSet in miniature: the table and the emulator exist only in that
namespace, the emulator behind an absolute symlink."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from execwatch.node.stack import StackOptions
from execwatch.pipeline import PipelineOptions
from execwatch.probe import layout
from execwatch.probe.loader import ProbeOptions
from execwatch.record import ExecFailure, Reason
from tests.support.binfmt.emulation import (
    BinfmtNamespace,
    aarch64_entry,
    binfmt_namespace,
    busybox_arm64,
    qemu_aarch64,
)
from tests.support.node.stack_runner import Running, node_stack
from tests.support.wait import wait_until

__all__ = ["binfmt_namespace", "busybox_arm64"]  # fixtures

WINDOW_S = 5.0  # long enough for every run of a case to fall in one window
RUNS = 3


class Traced:
    """The node stack, run as the agent runs it, on `table`, with the raw records sent."""

    def __init__(self, running: Running, raw: list[bytes]) -> None:
        self.running = running
        self.raw = raw

    @property
    def records(self) -> list[ExecFailure]:
        return self.running.records

    def emulated_sent(self, path: Path) -> list[bytes]:
        """The raw Emulated records the kernel sent for `path`."""
        return [
            r
            for r in self.raw
            if layout.KIND.unpack_from(r)[0] == layout.KIND_EMULATED
            and layout.EMULATED.unpack(r).filename.split(b"\0")[0] == bytes(path)
        ]

    def metric(self, name: str, **labels: str) -> float | None:
        value = self.running.stack.registry.get_sample_value(name, labels)
        return None if value is None else float(value)


@contextmanager
def traced(probe: ProbeOptions) -> Iterator[Traced]:
    raw: list[bytes] = []

    def tap(record: bytes, on_record: Callable[[bytes], None]) -> None:
        raw.append(record)
        on_record(record)

    options = StackOptions(
        probe=probe,
        pipeline=PipelineOptions(window=WINDOW_S),
        tap=tap,
    )
    with node_stack(options, loop="run") as running:
        yield Traced(running, raw)


def for_path(t: Traced, path: Path) -> ExecFailure:
    def found() -> ExecFailure | None:
        return next((r for r in t.records if r.event.path == str(path)), None)

    def seen() -> str:
        saw = [(r.event.path, str(r.diagnosis.reason)) for r in t.records]
        return f"no record for {path}; saw {saw}"

    record: ExecFailure = wait_until(found, 10.0, explain=seen)
    return record


def test_an_emulated_binary_is_one_emulated_record_per_window_counted_exactly(
    binfmt_namespace: BinfmtNamespace, busybox_arm64: Path, tmp_path: Path
) -> None:
    qemu = qemu_aarch64()
    binfmt_namespace.register(aarch64_entry("qemu-aarch64", qemu, "F"))
    script = tmp_path / "script.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o755)

    with traced(ProbeOptions(host_root=binfmt_namespace.root)) as t:
        assert t.running.probe.emulation_attached
        runs = [binfmt_namespace.run(busybox_arm64, "echo", "emulated") for _ in range(RUNS)]
        native = binfmt_namespace.run("/bin/true")
        shebang = binfmt_namespace.run(script)
        record = for_path(t, busybox_arm64)
        t.running.stop_loop()  # flushes the window: every count is in

        assert [(r.returncode, r.stdout) for r in runs] == [(0, "emulated\n")] * RUNS
        assert (native.returncode, shebang.returncode) == (0, 0)
        assert record.diagnosis.reason is Reason.EMULATED
        assert record.diagnosis.binary_arch == "arm64"
        assert record.diagnosis.interpreter == str(qemu)
        assert record.event.status == "EMULATED"
        assert len(t.emulated_sent(busybox_arm64)) == 1, "one record per binary and window"
        emulated = [r for r in t.records if r.diagnosis.reason is Reason.EMULATED]
        assert {r.event.path for r in emulated} == {str(busybox_arm64)}, "native and #! are not"
        assert sum(r.count for r in emulated) == RUNS
        assert t.metric("execwatch_events_total", errno="EMULATED", reason="Emulated") == RUNS
        assert t.metric("execwatch_kernel_emulated_execs_total", emulated_arch="arm64") == RUNS
        assert t.metric("execwatch_node_binfmt_emulators", emulated_arch="arm64", flags="F") == 1


def test_without_a_foreign_entry_the_program_is_not_attached_and_the_binary_is_foreign(
    binfmt_namespace: BinfmtNamespace, busybox_arm64: Path
) -> None:
    with traced(ProbeOptions(host_root=binfmt_namespace.root)) as t:
        probe = t.running.probe
        assert probe.emulation.supported, probe.emulation.unsupported
        assert not probe.emulation_attached and probe.emulation.link is None
        assert probe.binfmt_emulators() == ()

        ran = binfmt_namespace.run(busybox_arm64, "true")
        record = for_path(t, busybox_arm64)

        assert ran.returncode != 0 and "Exec format error" in ran.stderr
        assert record.diagnosis.reason is Reason.FOREIGN_ARCHITECTURE
        assert t.metric("execwatch_node_binfmt_emulators", emulated_arch="arm64", flags="F") is None


def test_the_program_follows_the_table_attached_then_detached(
    binfmt_namespace: BinfmtNamespace, busybox_arm64: Path
) -> None:
    with traced(ProbeOptions(host_root=binfmt_namespace.root)) as t:
        probe = t.running.probe
        binfmt_namespace.register(aarch64_entry("qemu-aarch64", qemu_aarch64(), ""))
        probe.refresh_emulators()
        assert probe.emulation_attached
        assert [e.arch for e in probe.binfmt_emulators()] == ["arm64"]

        binfmt_namespace.write("qemu-aarch64", "-1")
        probe.refresh_emulators()
        assert not probe.emulation_attached

        assert binfmt_namespace.run(busybox_arm64, "true").returncode != 0
        record = for_path(t, busybox_arm64)
        assert record.diagnosis.reason is Reason.FOREIGN_ARCHITECTURE


def test_a_native_entry_is_not_emulation(binfmt_namespace: BinfmtNamespace) -> None:
    amd64_magic = r"\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\x3e\x00"
    mask = r"\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff"
    binfmt_namespace.register(f":native:M::{amd64_magic}:{mask}:{qemu_aarch64()}:")
    with traced(ProbeOptions(host_root=binfmt_namespace.root)) as t:
        assert t.running.probe.emulation.read_at > 0, "the table was read"
        assert not t.running.probe.emulation_attached
        assert t.running.probe.binfmt_emulators() == ()


# -- the DaemonSet in miniature: the node's table and emulator only through its root -------

# The namespace's own file system at NODE_ONLY (an empty directory here): a copy of qemu,
# named by the entry through an absolute symlink, as /usr/bin/qemu-* often are on a node.
NODE_ONLY_SETUP = (
    'mount -t tmpfs -o size=32m node-only "$1" && mkdir "$1/real" "$1/bin"'
    ' && cp "$2" "$1/real/qemu-aarch64-static"'
    ' && ln -s "$1/real/qemu-aarch64-static" "$1/bin/qemu-aarch64-static"'
)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[BinfmtNamespace, Path]]:
    """A namespace standing for the node, its aarch64 entry registered (F, as
    tonistiigi/binfmt and qemu-user-static register theirs), and the entry's interpreter:
    a path that does not exist in the test's own mount namespace."""
    hidden = tmp_path / "node-only"
    hidden.mkdir()
    ns = BinfmtNamespace.start(NODE_ONLY_SETUP, str(hidden), str(qemu_aarch64()))
    try:
        interpreter = hidden / "bin" / "qemu-aarch64-static"
        ns.register(aarch64_entry("qemu-aarch64", interpreter, "F"))
        assert not interpreter.exists() and not interpreter.is_symlink(), "only in the node"
        assert Path(f"{ns.root}{interpreter}").is_symlink()
        yield ns, interpreter
    finally:
        ns.stop()


def test_the_nodes_table_and_emulator_are_read_through_the_nodes_root(
    node: tuple[BinfmtNamespace, Path], busybox_arm64: Path
) -> None:
    ns, interpreter = node
    with traced(ProbeOptions(host_root=ns.root)) as t:
        assert t.running.probe.emulation_attached
        assert [e.interpreter for e in t.running.probe.binfmt_emulators()] == [str(interpreter)]
        ran = ns.run(busybox_arm64, "echo", "emulated")
        record = for_path(t, busybox_arm64)

        assert (ran.returncode, ran.stdout) == (0, "emulated\n")
        assert record.diagnosis.reason is Reason.EMULATED
        assert record.diagnosis.interpreter == str(interpreter)
        assert t.running.probe.emulated_totals() == {"arm64": 1}


def test_with_the_agents_own_root_the_namespaces_table_is_found_and_read_in_its_root(
    node: tuple[BinfmtNamespace, Path], busybox_arm64: Path
) -> None:
    """The default host_root, /, and this machine's table (none): the namespace's table,
    mounted before the probe started, is found at start (probe.nsbinfmt), and its
    interpreter, behind a symlink that exists only in that namespace, resolved there."""
    ns, interpreter = node
    with traced(ProbeOptions()) as t:
        probe = t.running.probe
        assert probe.binfmt_emulators() == (), "not the node's"
        assert [e.interpreter for e in probe.namespace_emulators()] == [str(interpreter)]
        ran = ns.run(busybox_arm64, "true")
        record = for_path(t, busybox_arm64)

        assert ran.returncode == 0, "the namespace runs it, emulated"
        assert record.diagnosis.reason is Reason.EMULATED
        assert record.diagnosis.interpreter == str(interpreter)
        assert probe.emulated_totals() == {"arm64": 1}
        assert t.metric("execwatch_node_binfmt_emulators", emulated_arch="arm64", flags="F") is None


def test_an_entry_whose_interpreter_is_not_in_the_nodes_root_is_logged_once_and_unwatched(
    node: tuple[BinfmtNamespace, Path], caplog: pytest.LogCaptureFixture
) -> None:
    """The table read, but the interpreter looked up in another root (an F entry that a
    tonistiigi/binfmt container registered from its own file system): not watched."""
    ns, interpreter = node
    with traced(ProbeOptions(binfmt_table=ns.table)) as t:
        probe = t.running.probe
        probe.refresh_emulators()
        probe.refresh_emulators()

        assert not probe.emulation_attached and probe.binfmt_emulators() == ()
        assert [e.interpreter for e in probe.node_binfmt.unidentified] == [str(interpreter)]
        warned = [r for r in caplog.records if r.getMessage().startswith("binfmt_misc emulator")]
        assert len(warned) == 1, "once while it stays unidentified"
        assert warned[0].kv["interpreter"] == str(interpreter)  # type: ignore[attr-defined]


def test_a_node_root_that_cannot_be_opened_is_no_table_and_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with traced(ProbeOptions(host_root=tmp_path / "absent")) as t:
        probe = t.running.probe
        probe.refresh_emulators()

        assert not probe.emulation_attached and probe.binfmt_emulators() == ()
        warned = [r for r in caplog.records if r.getMessage() == "node binfmt_misc table not read"]
        assert len(warned) == 1
        assert "No such file or directory" in warned[0].kv["reason"]  # type: ignore[attr-defined]
