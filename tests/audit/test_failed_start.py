"""`execwatch audit` of workloads whose entrypoint no architecture runs: scripts without
`#!` (none, after a BOM, after a blank line) in amd64-only images, and multi-arch images
whose entrypoint is a macOS or a Windows build (real Go cross-compiles). Each is
would-fail on every architecture, the one its image lacks included. Against a real
kube-apiserver and registry."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.audit.audit_cli import AuditCli
from tests.audit.test_audit import sel, template
from tests.support.images.imagebuild import Image, file, oci_layout
from tests.support.kube.apiserver import KubeCluster
from tests.support.registry.registry_server import Registry

NS = "broken-start"


# workload -> (its /app/run: bytes, or a cached Go build's name; check; what it says)
CASES: dict[str, tuple[bytes | str, str, str]] = {
    "no-shebang": (b"echo hello\n", "missing-shebang", "no #! interpreter line"),
    "bom": (b"\xef\xbb\xbf#!/bin/sh\necho hi\n", "missing-shebang", "a UTF-8 byte order mark"),
    "blank-line": (b"\n#!/bin/sh\necho hi\n", "missing-shebang", "a blank first line before #!"),
    "darwin": ("hello-darwin-arm64", "foreign-os", "a macOS arm64 executable (Mach-O)"),
    "windows": ("hello-windows-amd64.exe", "foreign-os", "a Windows x86-64 executable (PE)"),
}


@pytest.fixture(scope="module")
def workloads(
    kube: KubeCluster,
    registry: Registry,
    foreign_os: dict[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A Deployment per case: the scripts in amd64-only images, the builds of another OS
    in images of both architectures."""
    images = {}
    for name, (data, check, _) in CASES.items():
        body = data if isinstance(data, bytes) else foreign_os[data].read_bytes()
        arches = ("amd64", "arm64") if check == "foreign-os" else ("amd64",)
        built = [Image([[file("app/run", body)]], a, entrypoint=["/app/run"]) for a in arches]
        layout = oci_layout(tmp_path_factory.mktemp(name), built)
        images[name] = registry.push(layout, f"broken/{name}:1")
    with kube.client() as api:
        client.CoreV1Api(api).create_namespace({"metadata": {"name": NS}})
        apps = client.AppsV1Api(api)
        for name, image in images.items():
            spec = {"selector": sel(name), "template": template(name, image)}
            apps.create_namespaced_deployment(NS, {"metadata": {"name": name}, "spec": spec})


def by_arch(doc: dict[str, Any], name: str) -> dict[str, dict[str, Any]]:
    [workload] = [w for w in doc["workloads"] if w["name"] == name]
    return {a: r for a, r in workload["architectures"].items() if a in ("amd64", "arm64")}


def test_such_workloads_would_fail_on_every_architecture(
    workloads: None,
    audit_cli: AuditCli,
) -> None:
    code, out, _ = audit_cli("-n", NS, "--arch", "amd64", "--arch", "arm64", "--format", "json")
    doc = json.loads(out)
    assert code == 1
    for name, (_, check, said) in CASES.items():
        archs = by_arch(doc, name)
        assert {a: r["status"] for a, r in archs.items()} == {
            "amd64": "would-fail", "arm64": "would-fail",
        }, name  # fmt: skip
        for arch, result in archs.items():
            [container] = result["containers"]
            [finding] = container["findings"]
            assert (finding["check"], finding["entrypoint"]) == (check, True), (name, arch)
            assert said in finding["message"]
