"""One private dockerd, one rootful and one rootless Podman for the session, each with the
suite's workload images loaded."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import pytest

from tests.support.engines.dockerd import Dockerd
from tests.support.engines.podman import Podman, RootlessPodman
from tests.support.kubenode.node_images import (
    SIDE_NOSHEBANG,
    WEB_V2_ARM64,
    WEB_V2_MUSL,
    build_workloads,
)

IMAGES = (WEB_V2_ARM64, WEB_V2_MUSL, SIDE_NOSHEBANG)
P = TypeVar("P", bound=Podman)


@pytest.fixture(scope="session")
def workload_archives(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The workload images as OCI archives, by name (tests/support/kubenode/node_images.py)."""
    if os.geteuid() != 0:
        raise RuntimeError("the engine tests start container engines: run as root")
    archives = build_workloads(tmp_path_factory.mktemp("workloads"))
    by_name = {_name_of(a): a for a in archives}
    return {name: by_name[name] for name in IMAGES}


def _name_of(archive: Path) -> str:
    from tests.support.kubenode import node_images as images

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


@contextlib.contextmanager
def started(engine: P, archives: dict[str, Path]) -> Iterator[P]:
    """A Podman service with the workload images loaded (OCI archives); stopped after."""
    try:
        engine.start()
        for archive in archives.values():
            engine.load(archive)
        yield engine
    finally:
        engine.stop()


@pytest.fixture(scope="session")
def podman(
    tmp_path_factory: pytest.TempPathFactory, workload_archives: dict[str, Path]
) -> Iterator[Podman]:
    """Rootful Podman with its service socket."""
    with started(Podman(tmp_path_factory.mktemp("podman")), workload_archives) as engine:
        yield engine


ROOTLESS_USER = "ewrootless"


@pytest.fixture(scope="session")
def rootless_podman(workload_archives: dict[str, Path]) -> Iterator[RootlessPodman]:
    """The test user's own Podman service (the user created with subuid ranges if missing)."""
    with started(RootlessPodman(ROOTLESS_USER), workload_archives) as engine:
        yield engine
