"""`execwatch audit --emulates`: nodes whose binfmt_misc runs another architecture's binaries
through user-mode QEMU start those binaries instead of failing. Against a real kube-apiserver
and real registry: an "amd64" image built by mistake from an arm64 tree (its loader and
libraries there), the same with its arm64 loader deleted, and the suite's multi-platform
image whose riscv64 entry carries the arm64 tree."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from execwatch.audit.node_emulation import EVERY_NODE, Emulation, emulates
from execwatch.audit.report import WORD
from execwatch.runnable.verdict import Outcome, worst
from tests.audit.audit_cli import AuditCli
from tests.audit.test_audit import sel, statuses, template
from tests.support.images.imagebuild import Image, file, oci_layout
from tests.support.kube.apiserver import KubeCluster
from tests.support.registry.registry_fixtures import arm64_root
from tests.support.registry.registry_server import Registry

NS = "build"
ENTRY = ["/usr/bin/hello"]


@pytest.fixture(scope="module")
def emulating(
    kube: KubeCluster,
    registry: Registry,
    pushed: dict[str, str],
    foreign_root: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """An amd64 node and four Deployments (audited from their spec's tags)."""
    work = tmp_path_factory.mktemp("emulated-images")
    tree = arm64_root(foreign_root)
    no_loader = [file("usr/lib/.wh.ld-linux-aarch64.so.1", b"", 0o644)]
    images = {
        "built-on-arm": Image([tree], "amd64", entrypoint=ENTRY),
        "no-loader": Image([tree, no_loader], "amd64", entrypoint=ENTRY),
    }
    refs = {n: registry.push(oci_layout(work / n, [i]), f"build/{n}:1") for n, i in images.items()}
    refs |= {"multi": pushed["multi"], "web": pushed["hello"]}
    with kube.client() as api:
        core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
        core.create_namespace({"metadata": {"name": NS}})
        labels = {"kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux"}
        core.create_node({"metadata": {"name": "emulating-amd64-1", "labels": labels}})
        for name, image in refs.items():
            spec = {"selector": sel(name), "template": template(name, image)}
            apps.create_namespaced_deployment(NS, {"metadata": {"name": name}, "spec": spec})


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("emulated-cache")


Run = tuple[int, dict[str, Any]]


def run_json(audit_cli: AuditCli, cache: Path, *argv: str) -> Run:
    code, out, _ = audit_cli(
        "-n", NS, "--arch", "riscv64", "--format", "json", *argv, cache=cache
    )  # fmt: skip
    return code, json.loads(out)


def container(doc: dict[str, Any], workload: str, arch: str) -> dict[str, Any]:
    [found] = [w for w in doc["workloads"] if w["name"] == workload]
    [one] = found["architectures"][arch]["containers"]
    return dict(one)


WITHOUT = {
    "Deployment/built-on-arm": {"amd64": "would-fail", "riscv64": "missing-platform"},
    "Deployment/multi": {"amd64": "missing-platform", "riscv64": "would-fail"},
    "Deployment/no-loader": {"amd64": "would-fail", "riscv64": "missing-platform"},
    "Deployment/web": {"amd64": "ready", "riscv64": "missing-platform"},
}


def test_binaries_an_emulator_runs_are_emulated_not_failing(
    emulating: None,
    cache: Path,
    audit_cli: AuditCli,
) -> None:
    code, without = run_json(audit_cli, cache)
    assert (code, statuses(without)) == (1, WITHOUT)

    code, doc = run_json(audit_cli, cache, "--emulates", "arm64")

    assert code == 1, "emulated is not ready: slow, and failing where no emulator is"
    assert doc["emulates"] == {"amd64": ["arm64"], "riscv64": ["arm64"]}
    assert statuses(doc) == {
        **WITHOUT,
        "Deployment/built-on-arm": {"amd64": "emulated", "riscv64": "missing-platform"},
        "Deployment/multi": {"amd64": "missing-platform", "riscv64": "emulated"},
    }
    built = container(doc, "built-on-arm", "amd64")
    assert built["findings"] == []
    entry = [f for f in built["emulated"] if f["entrypoint"]]
    assert [(f["path"], f["arch"], f["check"]) for f in entry] == [
        ("/usr/bin/hello", "arm64", "arch-mismatch")
    ]
    assert {f["arch"] for f in built["emulated"]} == {"arm64"}
    # Under QEMU the arm64 hello still needs its arm64 loader: deleted, it fails there too.
    broken = container(doc, "no-loader", "amd64")
    failing = {f["path"]: f["check"] for f in broken["findings"]}
    assert failing["/usr/bin/hello"] == "arch-mismatch"
    assert "/usr/bin/hello" not in {f["path"] for f in broken["emulated"]}


def test_only_the_nodes_named_emulate(
    emulating: None,
    cache: Path,
    audit_cli: AuditCli,
) -> None:
    code, doc = run_json(audit_cli, cache, "--emulates", "riscv64=arm64")
    assert code == 1
    assert doc["emulates"] == {"riscv64": ["arm64"]}
    assert statuses(doc) == {
        **WITHOUT,
        "Deployment/multi": {"amd64": "missing-platform", "riscv64": "emulated"},
    }


def test_the_table_and_sarif_say_emulated(
    emulating: None,
    tmp_path: Path,
    cache: Path,
    audit_cli: AuditCli,
) -> None:
    report = tmp_path / "report.txt"
    common = ("-n", NS, "--emulates", "arm64", "--cache-dir", str(cache))
    code, _, _ = audit_cli(*common, "-o", str(report))
    text = report.read_text()
    assert code == 1
    assert "main: /usr/bin/hello ★ emulated (arm64) (+" in text
    assert "emulates arm64)" in text  # the amd64 column's header
    assert "4 workloads; per workload and architecture: 1 ready, 1 emulated," in text
    code, out, _ = audit_cli(*common, "--format", "sarif")
    results = json.loads(out)["runs"][0]["results"]
    emulated = [r for r in results if r["ruleId"] == "audit/emulated"]
    assert [r["level"] for r in emulated] == ["warning"]
    assert "built-on-arm on amd64" in emulated[0]["message"]["text"]


def test_emulates_values() -> None:
    assert emulates("arm64,riscv64") == (EVERY_NODE, frozenset({"arm64", "riscv64"}))
    assert emulates("x86_64=aarch64") == ("amd64", frozenset({"arm64"}))
    for bad in ("", "amd64=", "arm64,sparc9"):
        with pytest.raises(argparse.ArgumentTypeError):
            emulates(bad)
    emulation = Emulation.of_options([emulates("arm64,amd64"), emulates("amd64=riscv64")])
    assert emulation.of("amd64") == {"arm64", "riscv64"}, "a node's own arch is not emulated"
    assert emulation.of("arm64") == {"amd64"}


def test_audit_and_placement_speak_one_vocabulary() -> None:
    """The report has a word for every outcome placement writes, the same word for EMULATED,
    and a workload's outcome is the worst of its containers'."""
    assert set(WORD) == set(Outcome)
    assert WORD[Outcome.EMULATED] == Outcome.EMULATED
    ranked = [Outcome.RUNS, Outcome.EMULATED, Outcome.MISSING_PLATFORM, Outcome.FAILS]
    assert [worst([*ranked[: i + 1], Outcome.RUNS]) for i in range(4)] == ranked
    assert worst([Outcome.FAILS, Outcome.UNKNOWN, Outcome.RUNS]) is Outcome.UNKNOWN
    assert worst([]) is Outcome.RUNS
