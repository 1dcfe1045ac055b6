"""The linker's work grows with its input at most linearly and stops at its budget.

The hostile input is built for real: an executable with N missing DT_NEEDED names in a root
whose search path (ld.so.conf, DT_RPATH, DT_RUNPATH, LD_LIBRARY_PATH or musl's path file)
names M existing directories. Searching every name in every directory is N x M lookups:
the budget (runnable.limits.Limits) caps that product, and when it runs out the result says
so: never "all libraries found". The security review's reproduction (1,024 names x 4,096
ld.so.conf directories, 33.5 s and 758 MiB in explain() on the node) runs through the
node's own view of a root on disk (RootView, openat2).
"""

from __future__ import annotations

import io
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest

from execwatch.binfmt import ElfInfo, LibcFlavor, read_elf
from execwatch.diagnosis.startup import explain
from execwatch.record import Reason
from execwatch.runnable.directory import DirectoryFS
from execwatch.runnable.fs import FileSystem, Node
from execwatch.runnable.limits import Limits
from execwatch.runnable.linker import BudgetExhausted, Linker, Resolution
from execwatch.runnable.liveroot import MAX_NODES, RootView
from execwatch.runnable.memory import MemoryFS
from execwatch.runnable.openat2 import Root
from execwatch.scan.errors import LimitExceeded
from tests.support.binfmt.elfbuild import ElfSpec, build_elf
from tests.support.binfmt.hostile_elf import measure
from tests.support.images.imagebuild import Image, directory, file, oci_layout
from tests.support.scan.scan_cli import scan_error, scan_json

LIMITS = Limits()
GLIBC_LOADER = "/lib64/ld-linux-x86-64.so.2"
MUSL_LOADER = "/lib/ld-musl-x86_64.so.1"
SOURCES = ("ld.so.conf", "DT_RPATH", "DT_RUNPATH", "LD_LIBRARY_PATH", "musl-path")
STEPS = (1, 2, 4, 8, 16)  # N = 32 x step names, M = 32 x step directories
# A smaller budget keeps the five growth runs short; the reproduction below runs on the
# defaults. A DT_RPATH string is at most PATH_MAX (4 KiB: ElfLimits), 512 entries here.
SCALING = Limits(max_linker_probes=1 << 13)
# One run on the loaded 2-core box: the 16x input may cost at most this much more than the
# 1x one (quadratic would be 256x), and never more memory than this.
TIME_RATIO = 40.0
PEAK_BYTES = 48 << 20


@dataclass(frozen=True)
class Hostile:
    """A root holding /app and its search path, as files: path -> bytes (dirs end in /)."""

    files: dict[str, bytes]
    env: dict[str, str]
    loader: str


def hostile(source: str, names: int, dirs: int) -> Hostile:
    needed = [f"libmissing{i}.so" for i in range(names)]
    directories = [f"/d/{j}" for j in range(dirs)]
    joined = ":".join(directories)
    loader = MUSL_LOADER if source == "musl-path" else GLIBC_LOADER
    spec = ElfSpec(elf_type=2, interpreter=loader, needed=needed)
    if source == "DT_RPATH":
        spec.rpath = joined
    if source == "DT_RUNPATH":
        spec.runpath = joined
    files = {f"{d}/": b"" for d in directories}
    files[loader] = build_elf(ElfSpec(interpreter=None, soname=loader.rsplit("/", 1)[1])).data
    files["/app"] = build_elf(spec).data
    if source == "ld.so.conf":
        files["/etc/ld.so.conf"] = "\n".join(directories).encode()
    if source == "musl-path":
        files["/etc/ld-musl-x86_64.path"] = "\n".join(directories).encode()
    env = {"LD_LIBRARY_PATH": joined} if source == "LD_LIBRARY_PATH" else {}
    return Hostile(files, env, loader)


def in_memory(h: Hostile) -> MemoryFS:
    fs = MemoryFS()
    for path, data in h.files.items():
        if path.endswith("/"):
            fs.put(path.rstrip("/"), Node("dir", 0o755))
        elif data.startswith(b"\x7fELF"):
            fs.put(path, Node("file", 0o755, len(data), head=data[:64], elf=read_elf_bytes(data)))
        else:
            fs.put(path, Node("file", 0o644, len(data), text=data))
    return fs


def on_disk(h: Hostile, root: Path) -> Path:
    for path, data in h.files.items():
        target = root / path.lstrip("/")
        if path.endswith("/"):
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        target.chmod(0o755)
    return root


def read_elf_bytes(data: bytes) -> ElfInfo:
    return read_elf(io.BytesIO(data))


@dataclass(frozen=True)
class Outcome:
    result: Resolution | BaseException
    probes: int
    steps: int
    bytes: int


def resolve_app(fs: FileSystem, h: Hostile, limits: Limits = LIMITS) -> Outcome:
    linker = Linker(fs, h.env, limits)
    node = fs.node("/app")
    assert node is not None and node.elf is not None
    flavor: LibcFlavor = "musl" if h.loader == MUSL_LOADER else "glibc"
    result: Resolution | BaseException
    try:
        result = linker.resolve("/app", node.elf, flavor)
    except LimitExceeded as exc:
        result = exc
    work = linker.work
    return Outcome(result, work.probes, work.steps, work.bytes)


def never_a_silent_pass(outcome: Outcome, names: int) -> None:
    """Every name is missing: the result lists them all, or says the search stopped."""
    result = outcome.result
    if isinstance(result, BaseException):
        assert isinstance(result, BudgetExhausted), repr(result)
        return
    assert result.missing, "no library reported missing: a silent pass"
    assert len(result.missing) == names or result.incomplete, (len(result.missing), names)


def within_budget(outcome: Outcome, limits: Limits) -> None:
    # The check runs after each unit of work: one past the limit is where it stops.
    assert outcome.probes <= limits.max_linker_probes + 1
    assert outcome.steps <= limits.max_linker_steps + limits.max_search_dirs
    assert outcome.bytes <= limits.max_linker_bytes + 4096


@pytest.mark.parametrize("source", SOURCES)
def test_work_grows_at_most_linearly_and_stops_at_the_budget(source: str) -> None:
    costs = []
    for step in STEPS:
        names, dirs = 32 * step, 32 * step
        h = hostile(source, names, dirs)
        outcome, cost = measure(partial(resolve_app, in_memory(h), h, SCALING), repeat=1)
        assert isinstance(outcome, Outcome), repr(outcome)
        never_a_silent_pass(outcome, names)
        within_budget(outcome, SCALING)
        # Below the budget every name is tried in every directory, each pair once.
        if not isinstance(outcome.result, BaseException) and not outcome.result.incomplete:
            assert outcome.probes <= names * (dirs + 8)
        assert cost.peak_bytes < PEAK_BYTES, f"{source} x{step}: peak {cost.peak_bytes}"
        costs.append(cost)
    ratio = costs[-1].seconds / max(costs[0].seconds, 1e-3)
    assert ratio < TIME_RATIO, f"{source}: 16x the input took {ratio:.1f}x the time"


def test_the_budget_stops_the_search_with_the_first_missing_library_reported() -> None:
    h = hostile("ld.so.conf", names=1024, dirs=4096)
    outcome = resolve_app(in_memory(h), h)
    assert isinstance(outcome.result, Resolution)
    assert outcome.result.missing[0].name == "libmissing0.so"
    assert outcome.result.incomplete is not None
    assert "lookups" in outcome.result.incomplete
    assert outcome.probes == LIMITS.max_linker_probes + 1


def test_a_budget_spent_before_anything_is_missing_raises() -> None:
    """Nothing found missing yet: returning the partial result would read as "all found"."""
    h = hostile("ld.so.conf", names=64, dirs=64)
    tiny = Limits(max_linker_probes=10)
    linker = Linker(in_memory(h), h.env, tiny)
    node = in_memory(h).node("/app")
    assert node is not None and node.elf is not None
    with pytest.raises(BudgetExhausted, match="more than 10 lookups"):
        linker.resolve("/app", node.elf, "glibc")


@pytest.mark.parametrize("source", ["ld.so.conf", "musl-path"])
def test_search_directories_are_capped_across_all_sources(source: str) -> None:
    """3,000 + 1,000 + 500 directories: each source under its own cap, together over 4,096."""
    h = hostile(source, names=1, dirs=3000)
    fs = in_memory(h)
    env = {"LD_LIBRARY_PATH": ":".join(f"/e/{j}" for j in range(1000))}
    spec = ElfSpec(
        elf_type=2,
        interpreter=h.loader,
        needed=["libx.so"],
        rpath=":".join(f"/r/{j}" for j in range(500)),
    )
    app = build_elf(spec).data
    fs.put("/app", Node("file", 0o755, len(app), head=app[:64], elf=read_elf_bytes(app)))
    small = Limits(max_search_dirs=4096)
    outcome = resolve_app(fs, Hostile(h.files, env, h.loader), small)
    assert isinstance(outcome.result, BudgetExhausted)
    assert "more than 4096 library search directories" in str(outcome.result)
    assert outcome.probes == 0  # refused before the first lookup


def test_repeated_directories_are_searched_once() -> None:
    h = hostile("DT_RPATH", names=4, dirs=1)
    fs = in_memory(h)
    env = {"LD_LIBRARY_PATH": ":".join(["/d/0"] * 1000)}
    outcome = resolve_app(fs, Hostile(h.files, env, h.loader))
    # /d/0 (rpath, then LD_LIBRARY_PATH again) and the 6 default directories, per name.
    assert isinstance(outcome.result, Resolution) and len(outcome.result.missing) == 4
    assert outcome.probes == 4 * 7


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (";" * (4 << 20), "longer than"),  # the review's 4 MiB image config
        ("/a;" * 2000, "more than 1024 entries"),
        ("/" + "x" * (LIMITS.max_ld_library_path_bytes + 1), "longer than"),
    ],
)
def test_ld_library_path_is_bounded_before_it_is_split(value: str, message: str) -> None:
    h = hostile("LD_LIBRARY_PATH", names=1, dirs=1)
    started = time.perf_counter()
    outcome = resolve_app(in_memory(h), Hostile(h.files, {"LD_LIBRARY_PATH": value}, h.loader))
    assert isinstance(outcome.result, LimitExceeded)
    assert message in str(outcome.result)
    assert time.perf_counter() - started < 1.0


def _in_root(root: Path, fn: Callable[[RootView], object]) -> object:
    fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    handle = Root(fd, str(root))
    try:
        return fn(RootView(handle))
    finally:
        handle.close()


def test_the_reviews_reproduction_is_diagnosed_within_the_budget(tmp_path: Path) -> None:
    """1,024 missing names x 4,096 ld.so.conf directories, in a root on disk, read the way
    the node agent reads it. Before: explain() took 33.5 s and 758 MiB."""
    root = on_disk(hostile("ld.so.conf", names=1024, dirs=4096), tmp_path / "root")
    assert (root / "app").stat().st_size < 40 << 10

    def diagnose(view: RootView) -> object:
        node = view.node("/app")
        assert node is not None and node.elf is not None
        return explain(view, "/app", node.elf), view.cached

    outcome, cost = measure(lambda: _in_root(root, diagnose), repeat=1)
    assert isinstance(outcome, tuple), repr(outcome)
    finding, cached = outcome
    assert finding is not None and finding.reason == Reason.MISSING_LIBRARY
    assert finding.library == "libmissing0.so"
    assert cached <= MAX_NODES
    assert cost.seconds < LIMITS.max_linker_seconds + 2.0, f"{cost.seconds:.1f}s"
    assert cost.peak_bytes < PEAK_BYTES, f"peak {cost.peak_bytes} bytes"


def test_the_root_view_is_a_bounded_lru(tmp_path: Path) -> None:
    root = tmp_path / "root"
    for j in range(MAX_NODES + 10):
        (root / "d" / str(j)).mkdir(parents=True)

    def walk(view: RootView) -> tuple[int, bool, bool]:
        first = view.node("/d/0")
        for j in range(1, MAX_NODES + 10):
            view.node("/d/0")  # kept: used last
            view.node(f"/d/{j}")
            assert view.cached <= MAX_NODES
        # Past the bound nothing reads as missing: an evicted entry is described again.
        again = view.node("/d/5")
        return view.cached, first is not None and first.kind == "dir", again is not None

    assert _in_root(root, walk) == (MAX_NODES, True, True)


def test_a_directory_root_resolves_the_same_way(tmp_path: Path) -> None:
    """The scanner's view of a root on disk gives the same answer as the image's."""
    h = hostile("DT_RUNPATH", names=8, dirs=8)
    outcome = resolve_app(DirectoryFS(str(on_disk(h, tmp_path / "r"))), h)
    assert isinstance(outcome.result, Resolution)
    assert [m.name for m in outcome.result.missing] == [f"libmissing{i}.so" for i in range(8)]
    assert outcome.probes == 8 * (8 + 6)


def _image(h: Hostile, env: list[str]) -> Image:
    entries = [
        directory(p.strip("/")) if p.endswith("/") else file(p.lstrip("/"), data)
        for p, data in h.files.items()
    ]
    return Image([entries], entrypoint=["/app"], env=env)


def test_an_image_config_ld_library_path_bomb_is_refused_quickly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """3 MiB of `;` in the config's Env: one JSON value, 3 million entries (before: 37 s)."""
    h = hostile("ld.so.conf", names=1, dirs=1)
    layout = oci_layout(tmp_path / "l", [_image(h, ["LD_LIBRARY_PATH=" + ";" * (3 << 20)])])
    started = time.perf_counter()
    error = scan_error(capsys, str(layout))
    assert "LD_LIBRARY_PATH is longer than" in error
    assert time.perf_counter() - started < 5.0


def test_a_scan_of_the_reproduction_reports_the_stop_and_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    h = hostile("ld.so.conf", names=1024, dirs=4096)
    code, doc = scan_json(capsys, str(oci_layout(tmp_path / "l", [_image(h, [])])))
    assert code == 1
    messages = [f["message"] for f in doc["findings"] if f["check"] == "missing-library"]
    assert messages[0].startswith("libmissing0.so: not found")
    assert "library search stopped, more may be missing" in messages[-1]
