"""Registry fixtures, and a home without anybody's real credential files."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.scan.conftest import built, host_glibc, host_musl
from tests.support.registry.registry_fixtures import hostile, pushed, registry

__all__ = ["built", "host_glibc", "host_musl", "hostile", "pushed", "registry"]


@pytest.fixture(autouse=True)
def clean_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    for name in ("REGISTRY_AUTH_FILE", "DOCKER_CONFIG", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    return home
