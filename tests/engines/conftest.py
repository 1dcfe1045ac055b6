"""One private dockerd for the session, with the suite's workload images loaded."""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.node.images import SIDE_NOSHEBANG, WEB_V2_ARM64, WEB_V2_MUSL, build_workloads
from tests.support.engines.dockerd import Dockerd
from tests.support.engines.podman import Podman

IMAGES = (WEB_V2_ARM64, WEB_V2_MUSL, SIDE_NOSHEBANG)


@pytest.fixture(scope="session")
def workload_archives(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The workload images as OCI archives, by name (tests/node/images.py builds them)."""
    if os.geteuid() != 0:
        raise RuntimeError("the engine tests start container engines: run as root")
    archives = build_workloads(tmp_path_factory.mktemp("workloads"))
    by_name = {_name_of(a): a for a in archives}
    return {name: by_name[name] for name in IMAGES}


def _name_of(archive: Path) -> str:
    from tests.node import images

    names = {
        "web-v2-arm64.tar": images.WEB_V2_ARM64,
        "web-v2-musl.tar": images.WEB_V2_MUSL,
        "side-noshebang.tar": images.SIDE_NOSHEBANG,
    }
    return names.get(archive.name, archive.name)


@pytest.fixture(scope="session")
def dockerd(
    tmp_path_factory: pytest.TempPathFactory, workload_archives: dict[str, Path]
) -> Iterator[Dockerd]:
    daemon = Dockerd(tmp_path_factory.mktemp("dockerd"))
    try:
        daemon.start()
        with ThreadPoolExecutor(len(workload_archives)) as pool:
            list(
                pool.map(lambda item: daemon.load_oci(item[1], item[0]), workload_archives.items())
            )
        yield daemon
    finally:
        daemon.stop()


@pytest.fixture(scope="session")
def podman(
    tmp_path_factory: pytest.TempPathFactory, workload_archives: dict[str, Path]
) -> Iterator[Podman]:
    """Rootful Podman with its service socket, the same images loaded (OCI archives)."""
    engine = Podman(tmp_path_factory.mktemp("podman"))
    try:
        engine.start()
        for archive in workload_archives.values():
            engine.load(archive)
        yield engine
    finally:
        engine.stop()
