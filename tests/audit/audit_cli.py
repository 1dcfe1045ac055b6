"""`execwatch audit` run in-process, as its command line runs it, against the tests' API
server and registry: what the `audit_cli` fixture (conftest.py) calls."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from execwatch.cli import main
from tests.support.kube.apiserver import ADMIN_TOKEN, KubeCluster
from tests.support.registry.registry_server import Registry

NS = "shop"  # the mixed cluster's namespace (test_audit's `cluster`), audited unless -n says
AuditCli = Callable[..., tuple[int, str, str]]  # (*argv, token=, cache=) -> (code, out, err)


def audit(
    capsys: pytest.CaptureFixture[str],
    kube: KubeCluster,
    registry: Registry,
    tmp_path: Path,
    *argv: str,
    token: str = ADMIN_TOKEN,
    cache: Path | None = None,
) -> tuple[int, str, str]:
    kubeconfig = kube.kubeconfig(token, tmp_path / "kubeconfig")
    auth = registry.auth_file(tmp_path / "auth.json")
    capsys.readouterr()
    code = main(
        [
            "audit",
            "--kubeconfig",
            str(kubeconfig),
            "-n",
            NS,
            "--no-progress",
            "--registry-config",
            str(auth),
            "--registry-ca",
            str(registry.ca),
            "--cache-dir",
            str(cache or tmp_path / "cache"),
            *argv,
        ]
    )
    out = capsys.readouterr()
    return code, out.out, out.err
