"""Fixtures shared by the attribution tests: the probe, runc, and a started Attributor."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from execwatch.attribution import Attributor
from execwatch.attribution.cri.client import CriContainers
from tests.support.probe.probe_recorder import ProbeRecorder
from tests.support.runtime.containerd import Containerd
from tests.support.runtime.runc import Runc, remove_empty_kubepods


@pytest.fixture(scope="session")
def root() -> Iterator[None]:
    if os.geteuid() != 0:
        raise RuntimeError("the attribution tests create cgroups and containers: run as root")
    yield
    remove_empty_kubepods()


@pytest.fixture(scope="module")
def probe(root: None) -> Iterator[ProbeRecorder]:
    with ProbeRecorder() as recorder:
        yield recorder


@pytest.fixture(scope="module")
def runc(root: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runc]:
    runtime = Runc(tmp_path_factory.mktemp("runc"))
    yield runtime
    runtime.cleanup()


@pytest.fixture(scope="module")
def host_attributor(root: None) -> Iterator[Attributor]:
    """No CRI runtime at all: what the cgroup path alone gives."""
    attributor = Attributor(containers=CriContainers(sockets=[]))
    attributor.start()
    yield attributor
    attributor.close()


@pytest.fixture(scope="module")
def cri_attributor(containerd: Containerd) -> Iterator[Attributor]:
    attributor = Attributor(containers=CriContainers(sockets=[containerd.socket]))
    attributor.start()
    yield attributor
    attributor.close()
