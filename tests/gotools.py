"""The Go tools `make test` builds in the background, and the tests that wait for them.

dev/test.sh runs dev/go-tools.sh in the background and points EXECWATCH_GO_TOOLS_RUN at
its run directory: `pid`, then per tool TOOL.log and, once it is through, TOOL.ready or
TOOL.failed, and `done` at the end. tests/conftest.py runs the tests that need no tool
first, then the others in the order the tools are built, and before each test waits
for the tools it needs. Without the variable (pytest run by hand, the tools built by
`make setup-test`) nothing waits: a missing tool fails the test that needs it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

RUN_ENV = "EXECWATCH_GO_TOOLS_RUN"
BUDGET_ENV = "EXECWATCH_GO_TOOLS_BUDGET"
BUDGET_S = 3600.0  # from the start of the builds: a fresh machine needs 25 to 40 minutes
POLL_S = 2.0
LOG_TAIL_LINES = 30

# dev/go-tools.sh's order, which is also the order of the tests that need them.
TOOLS = (
    "registry",
    "etcd",
    "kube-apiserver",
    "helm",
    "node",
    "kwok",
    "prometheus",
    "rollouts",
    "prometheus-operator",
)

KUBE = frozenset({"etcd", "kube-apiserver"})
# (module defining the fixture, fixture name) -> the tools behind it
FIXTURE_TOOLS: Mapping[tuple[str, str], frozenset[str]] = {
    ("tests.support.kube.apiserver_fixtures", "kube"): KUBE,
    ("tests.support.registry.registry_fixtures", "registry"): frozenset({"registry"}),
    ("tests.node.conftest", "node"): KUBE | {"node"},
    ("tests.node.conftest", "release"): frozenset({"helm"}),
    ("tests.node.conftest", "prometheus"): frozenset({"prometheus"}),
    ("tests.fleet.conftest", "fleet"): KUBE | {"node", "kwok"},
}
# Module name prefix -> tools, for a test module by its own name and by the names it
# imports (a test that starts a tool itself, not through a fixture).
MODULE_TOOLS: Mapping[str, frozenset[str]] = {
    "tests.kube.": KUBE,
    "tests.registry.": frozenset({"registry"}),
    "tests.deploy.": frozenset({"helm"}),
    "tests.node.": KUBE | {"node", "helm"},
    "tests.node.test_story_rollout": frozenset({"rollouts"}),
    "tests.fleet.": KUBE | {"node", "kwok"},
    "tests.monitoring.": KUBE | {"helm", "prometheus", "prometheus-operator"},
    # the shared harnesses (tests/support/<concern>/) that start a tool
    "tests.support.kube.": KUBE,
    "tests.support.kube.kwok": KUBE | {"node", "kwok"},
    "tests.support.kubenode.": KUBE | {"node", "helm"},
    "tests.support.registry.": frozenset({"registry"}),
    "tests.support.deploy.": frozenset({"helm"}),
}


def tools_needed(modules: Iterable[str], fixtures: Iterable[tuple[str, str]]) -> frozenset[str]:
    """The tools a test needs: `modules` are its module's name and the modules of what
    that module imports, `fixtures` the (defining module, name) of every fixture it uses."""
    needed: set[str] = set()
    for fixture in fixtures:
        needed |= FIXTURE_TOOLS.get(fixture, frozenset())
    for module in modules:
        for prefix, tools in MODULE_TOOLS.items():
            if module.startswith(prefix):
                needed |= tools
    return frozenset(needed)


def order_key(tools: Iterable[str]) -> int:
    """-1 for no tool, else the build position of the last tool needed."""
    return max((TOOLS.index(t) for t in tools), default=-1)


@dataclass(frozen=True)
class ToolUnavailable:
    tool: str
    reason: str
    log: Path

    def message(self) -> str:
        tail = _tail(self.log, LOG_TAIL_LINES)
        return (
            f"Go tool {self.tool!r} is not available: {self.reason} "
            f"(dev/go-tools.sh; the end of {self.log}):\n{tail}"
        )


def _tail(path: Path, lines: int) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"(no log: {exc.strerror})"
    return "\n".join(text.splitlines()[-lines:])


def _alive(pid: int) -> bool:
    """A live process (a zombie is not: dev/test.sh reaps the builder only at the end)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


@dataclass(frozen=True)
class BuildRun:
    """One run of dev/go-tools.sh, seen through its run directory."""

    directory: Path
    budget_s: float = BUDGET_S  # from the start of the builds

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> BuildRun | None:
        run = env.get(RUN_ENV)
        if not run:
            return None
        return cls(Path(run), float(env.get(BUDGET_ENV) or BUDGET_S))

    def log(self, tool: str) -> Path:
        return self.directory / f"{tool}.log"

    def deadline(self) -> float:
        """The start of the builds (dev/go-tools.sh writes `pid` first) plus the budget."""
        try:
            started = (self.directory / "pid").stat().st_mtime
        except OSError:
            started = time.time()
        return started + self.budget_s

    def check(self, tool: str) -> ToolUnavailable | bool:
        """True: ready; False: still to come; else why it will not come."""
        d = self.directory
        if (d / f"{tool}.ready").exists():
            return True
        if (d / f"{tool}.failed").exists():
            status = (d / f"{tool}.failed").read_text().strip()
            return ToolUnavailable(tool, f"its build failed ({status})", self.log(tool))
        if (d / "done").exists():
            return ToolUnavailable(tool, "the builds ended without it", d / "log")
        pid = self._pid()
        if pid is not None and not _alive(pid):
            return ToolUnavailable(tool, f"the builder (pid {pid}) is gone", d / "log")
        return False

    def _pid(self) -> int | None:
        try:
            return int((self.directory / "pid").read_text())
        except (OSError, ValueError):
            return None  # not started yet (waiting for another clone's builds)

    def wait(
        self,
        tool: str,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> ToolUnavailable | None:
        """Block until `tool` is ready (None) or cannot be (why), at most until the
        budget from the start of the builds is spent."""
        deadline = self.deadline()
        while True:
            state = self.check(tool)
            if state is True:
                return None
            if isinstance(state, ToolUnavailable):
                return state
            now = clock()
            if now >= deadline:
                late = (
                    f"still not built {self.budget_s:.0f} s after the builds started ({BUDGET_ENV})"
                )
                return ToolUnavailable(tool, late, self.log(tool))
            sleep(min(POLL_S, deadline - now))
