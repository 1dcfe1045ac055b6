"""`make test` builds the Go tools in the background: the tests that need a tool wait for
its stamp, and fail loudly, with the build's log, when it cannot come (tests/gotools.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.gotools import TOOLS, BuildRun, order_key, tools_needed

REPO = Path(__file__).resolve().parent.parent
PYTEST = (sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider")
VERSIONS = {  # every pin of dev/k8s-tools.sh and dev/registry-tool.sh, overridden
    "KUBERNETES_VERSION": "v1.0.0",
    "KUBE_NODE_VERSION": "v1.0.0",
    "ETCD_VERSION": "vtest",
    "HELM_VERSION": "vtest",
    "ARGO_ROLLOUTS_VERSION": "vtest",
    "PROMETHEUS_VERSION": "vtest",
    "KWOK_VERSION": "vtest",
    "PROMETHEUS_OPERATOR_VERSION": "vtest",
    "PROMETHEUS_TAGS": "",
    "REGISTRY_VERSION": "vtest",
}
BINARIES = {  # k8s-bin binary -> its version stamp under VERSIONS
    "etcd": "vtest",
    "kube-apiserver": "v1.0.0",
    "helm": "vtest",
    "kubelet": "v1.0.0",
    "kube-controller-manager": "v1.0.0",
    "kube-scheduler": "v1.0.0",
    "rollouts-controller": "vtest",
    "kwok": "vtest",
    "prometheus": "vtest tags=",
    "prometheus-operator": "vtest",
}


def building(tmp_path: Path) -> BuildRun:
    """A run directory whose builder (this very process) is alive and has built nothing."""
    (tmp_path / "pid").write_text(str(os.getpid()))
    return BuildRun(tmp_path, budget_s=600)


def must_not_sleep(seconds: float) -> None:
    raise AssertionError(f"waited {seconds} s")


def test_a_test_waits_until_its_tool_is_built(tmp_path: Path) -> None:
    run = building(tmp_path)
    naps: list[float] = []

    def sleep(seconds: float) -> None:
        naps.append(seconds)
        if len(naps) == 3:
            (tmp_path / "helm.ready").touch()

    assert run.wait("helm", sleep=sleep) is None
    assert len(naps) == 3


def test_a_failed_build_fails_at_once_with_the_end_of_its_log(tmp_path: Path) -> None:
    run = building(tmp_path)
    lines = [f"line {i}" for i in range(100)] + ["go: cannot find module k8s.io/kubernetes"]
    (tmp_path / "etcd.log").write_text("\n".join(lines) + "\n")
    (tmp_path / "etcd.failed").write_text("exit 1\n")

    unavailable = run.wait("etcd", sleep=must_not_sleep)

    assert unavailable is not None
    message = unavailable.message()
    assert "Go tool 'etcd' is not available: its build failed (exit 1)" in message
    assert message.endswith("line 99\ngo: cannot find module k8s.io/kubernetes")
    assert "line 69\n" not in message  # the tail only


def test_a_build_past_its_budget_fails(tmp_path: Path) -> None:
    run = building(tmp_path)
    deadline = run.deadline()
    unavailable = run.wait("node", clock=lambda: deadline, sleep=lambda s: None)
    assert unavailable is not None
    assert "not built 600 s after the builds started (EXECWATCH_GO_TOOLS_BUDGET)" in (
        unavailable.message()
    )


def test_a_builder_that_died_without_the_tool_fails_the_wait(tmp_path: Path) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    (tmp_path / "pid").write_text(str(dead.pid))
    unavailable = BuildRun(tmp_path).wait("prometheus", sleep=must_not_sleep)
    assert unavailable is not None
    assert f"the builder (pid {dead.pid}) is gone" in unavailable.message()


def test_builds_that_ended_without_the_tool_fail_the_wait(tmp_path: Path) -> None:
    run = building(tmp_path)
    (tmp_path / "done").write_text("1\n")
    unavailable = run.wait("rollouts", sleep=must_not_sleep)
    assert unavailable is not None
    assert "the builds ended without it" in unavailable.message()


def test_tools_come_from_fixtures_and_imports_in_build_order() -> None:
    kube = ("tests.support.kube.apiserver_fixtures", "kube")
    node = [("tests.node.conftest", f) for f in ("node", "release", "prometheus")]
    assert tools_needed(["tests.scan.test_inputs", "pathlib"], []) == frozenset()
    assert tools_needed(["tests.cluster.test_crd"], [kube]) == {"etcd", "kube-apiserver"}
    # a parametrized argument named like a fixture is not that fixture
    assert tools_needed(["tests.binfmt.test_platform"], [("_pytest.fixtures", "node")]) == set()
    # a module that runs a tool itself, by what it imports
    assert tools_needed(["tests.placement.test_run", "tests.support.kube.apiserver"], []) == {
        "etcd",
        "kube-apiserver",
    }
    assert tools_needed(
        ["tests.audit.test_audit", "tests.support.registry.registry_server"], []
    ) == {"registry"}
    rollout = tools_needed(["tests.node.test_story_rollout"], node)
    assert rollout == {"etcd", "kube-apiserver", "node", "helm", "prometheus", "rollouts"}
    assert order_key(rollout) == TOOLS.index("rollouts")
    monitoring = tools_needed(["tests.monitoring.test_servicemonitor"], [kube])
    assert monitoring == {"etcd", "kube-apiserver", "helm", "prometheus", "prometheus-operator"}
    assert order_key(monitoring) == len(TOOLS) - 1
    assert order_key(()) == -1 < order_key({"registry"}) < order_key({"etcd", "helm"})


def test_the_suite_runs_tool_free_tests_first_and_tests_node_in_file_order() -> None:
    out = subprocess.run(
        [*PYTEST, "--collect-only", "tests/node", "tests/kube", "tests/test_text.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    modules = list(
        dict.fromkeys(line.split("::")[0] for line in out.stdout.splitlines() if "::" in line)
    )
    node = sorted(m for m in modules if m.startswith("tests/node/"))
    kube = sorted(m for m in modules if m.startswith("tests/kube/"))  # a directory moves whole
    assert "tests/kube/test_control_plane.py" in kube
    assert modules == ["tests/test_text.py", *kube, *node], out.stderr


def test_a_test_whose_tool_failed_to_build_fails_with_the_log(tmp_path: Path) -> None:
    (tmp_path / "pid").write_text(str(os.getpid()))
    (tmp_path / "etcd.log").write_text("go: downloading go.etcd.io/etcd\nfatal: no network\n")
    (tmp_path / "etcd.failed").write_text("exit 1\n")
    out = subprocess.run(
        [*PYTEST, "tests/kube/test_control_plane.py::test_an_unknown_token_is_rejected"],
        cwd=REPO,
        env={**os.environ, "EXECWATCH_GO_TOOLS_RUN": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1, out.stdout
    assert "Go tool 'etcd' is not available: its build failed (exit 1)" in out.stdout
    assert "fatal: no network" in out.stdout
    assert "1 error" in out.stdout


def fake_go(tmp_path: Path) -> dict[str, str]:
    """An environment whose `go` fails every build, with scratch output directories."""
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    go = bin_dir / "go"
    go.write_text("#!/bin/sh\necho 'go: fake failure of' \"$@\" >&2\nexit 1\n")
    go.chmod(0o755)
    return {
        **os.environ,
        **VERSIONS,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "EXECWATCH_K8S_BIN": str(tmp_path / "k8s-bin"),
        "EXECWATCH_REGISTRY_BIN": str(tmp_path / "registry-bin" / "registry"),
    }


def go_tools(run: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    run.mkdir()
    return subprocess.run(
        [str(REPO / "dev" / "go-tools.sh"), str(run)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_go_tools_stamps_every_failed_build_and_goes_on(tmp_path: Path) -> None:
    out = go_tools(tmp_path / "run", fake_go(tmp_path))
    assert out.returncode == 1, out.stderr
    run = tmp_path / "run"
    assert sorted(p.name for p in run.glob("*.failed")) == sorted(f"{t}.failed" for t in TOOLS)
    assert (run / "registry.failed").read_text() == "exit 1\n"
    assert "go: fake failure of install" in (run / "registry.log").read_text()
    assert (run / "done").read_text() == "1\n"


def test_go_tools_builds_nothing_that_is_already_built(tmp_path: Path) -> None:
    env = fake_go(tmp_path)  # any build would fail
    k8s = tmp_path / "k8s-bin"
    for name, version in {**BINARIES, "registry": "vtest"}.items():
        d = tmp_path / "registry-bin" if name == "registry" else k8s
        d.mkdir(exist_ok=True)
        (d / name).touch(mode=0o755)
        (d / f".{name}.version").write_text(version + "\n")
    out = go_tools(tmp_path / "run", env)
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in (tmp_path / "run").glob("*.ready")) == sorted(
        f"{t}.ready" for t in TOOLS
    )
    assert (tmp_path / "run" / "done").read_text() == "0\n"
