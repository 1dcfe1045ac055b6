"""Fixtures shared by the whole suite."""

from __future__ import annotations

import logging
import os
import time
import types
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from execwatch.logs import KeyValueFormatter
from execwatch.pipeline import NodePipeline
from tests.gotools import TOOLS, BuildRun, ToolUnavailable, order_key, tools_needed
from tests.support.binfmt.foreign_arch import FOREIGN
from tests.support.runtime.containerd import Containerd

GO_TOOLS = pytest.StashKey[dict[str, ToolUnavailable | None]]()  # tool -> why not, once known


@pytest.fixture(scope="session")
def foreign_root() -> Path:
    """Unpacked Debian packages of other architectures (dev/fetch-foreign.sh)."""
    if not (FOREIGN / ".complete-v1").exists():
        pytest.fail(f"{FOREIGN} is missing: run dev/fetch-foreign.sh (make test does)")
    return FOREIGN


@pytest.fixture(scope="module")
def containerd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Containerd]:
    """containerd with its CRI plugin on a private socket, images imported, no registry."""
    runtime = Containerd(tmp_path_factory.mktemp("containerd"))
    try:
        runtime.start()
        yield runtime
    finally:
        runtime.stop()


@pytest.fixture(autouse=True)
def no_cli_log_handler() -> Iterator[None]:
    """A test that runs the CLI in-process points the root logger at the stderr pytest
    captured for it. Later tests would log into that closed stream, and each record
    would print a traceback and slow its thread down."""
    yield
    root = logging.getLogger()
    root.handlers[:] = [h for h in root.handlers if not isinstance(h.formatter, KeyValueFormatter)]


def _tools(item: pytest.Item) -> frozenset[str]:
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs if info is not None else {}
    fixtures = [(d[-1].func.__module__, name) for name, d in defs.items() if d]
    module = getattr(item, "module", None)
    modules = [module.__name__] if isinstance(module, types.ModuleType) else []
    for value in vars(module).values() if modules else ():
        if isinstance(value, types.ModuleType):
            modules.append(value.__name__)
        elif isinstance(name := getattr(value, "__module__", None), str):
            modules.append(name)
    return tools_needed(modules, fixtures)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that need no Go tool first, then by the build order of the tools they need
    (tests/gotools.py), so that `make test` runs them while the tools build. A directory
    moves as a whole, in its own order (tests/node's modules depend on theirs)."""
    keys: dict[Path, int] = {}
    for item in items:
        d = item.path.parent
        keys[d] = max(keys.get(d, -1), order_key(_tools(item)))
    items.sort(key=lambda item: keys[item.path.parent])


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    """Wait for the Go tools this test needs while `make test` builds them: outside
    the test's own timeout, which starts inside."""
    run = BuildRun.from_env(os.environ)
    if run is not None:
        known = item.config.stash.setdefault(GO_TOOLS, {})
        needed = _tools(item)
        for tool in sorted(needed - known.keys(), key=TOOLS.index):
            if any(known.get(t) for t in needed):
                break  # this test fails anyway
            known[tool] = _wait(item.config, run, tool)
    return (yield)


def _wait(config: pytest.Config, run: BuildRun, tool: str) -> ToolUnavailable | None:
    state = run.check(tool)
    if state is not False:
        return None if state is True else state
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    say = reporter.write_line if reporter is not None else print
    say(f"waiting for the Go tool {tool} (building: {run.log(tool)})")
    t0 = time.monotonic()
    unavailable = run.wait(tool)
    outcome = "ready" if unavailable is None else "NOT AVAILABLE"
    say(f"{tool}: {outcome} after {time.monotonic() - t0:.0f} s")
    return unavailable


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test whose tool could not be built fails, with the end of the build's log."""
    known = item.config.stash.get(GO_TOOLS, {})
    for tool in sorted(_tools(item), key=TOOLS.index):
        unavailable = known.get(tool)
        if unavailable is not None:
            pytest.fail(unavailable.message(), pytrace=False)


@pytest.fixture
def pipelines() -> Iterator[list[NodePipeline]]:
    """NodePipelines a test makes, closed after it (their diagnosis workers stopped)."""
    made: list[NodePipeline] = []
    yield made
    for p in made:
        p.close()


@pytest.fixture(scope="session")
def foreign_os() -> dict[str, Path]:
    """Go cross-compiles for macOS, Windows and the BSDs (dev/build-foreign-os.sh)."""
    from tests.support.binfmt.foreignos import built

    try:
        return built()
    except AssertionError as exc:
        pytest.fail(str(exc))
