"""A real API server and a real registry for the audit tests, and `execwatch audit` run
against them."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from tests.audit.audit_cli import AuditCli, audit
from tests.registry.conftest import clean_home
from tests.scan.conftest import built, host_glibc, host_musl
from tests.support.kube.apiserver import KubeCluster
from tests.support.kube.apiserver_fixtures import admin, kube
from tests.support.registry.registry_fixtures import pushed, registry
from tests.support.registry.registry_server import Registry

__all__ = ["admin", "built", "clean_home", "host_glibc", "host_musl", "kube", "pushed", "registry"]


@pytest.fixture
def audit_cli(
    capsys: pytest.CaptureFixture[str], kube: KubeCluster, registry: Registry, tmp_path: Path
) -> AuditCli:
    """`execwatch audit` against this API server (as admin unless token= says) and this
    registry, with a cache of the test's own unless cache= names one:
    audit_cli(*argv, token=, cache=) -> (exit code, stdout, stderr)."""
    return functools.partial(audit, capsys, kube, registry, tmp_path)
