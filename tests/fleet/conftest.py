"""One simulated fleet for tests/fleet: a control plane of its own (deploy/base applied),
controller-manager, scheduler and kwok, 100 nodes (70 amd64, 30 arm64) and the agent
DaemonSet on every node."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.kube.apiserver import MissingBinaries, find_binaries
from tests.support.kube.kwok import Fleet, FleetError, find_fleet_binaries, fleet_cluster

NODES = 100


@dataclass
class AgentFleet:
    fleet: Fleet
    agents: dict[str, Any]  # node name -> the agent DaemonSet's pod on it


@pytest.fixture(scope="session")
def fleet() -> Iterator[AgentFleet]:
    try:
        find_binaries()
        find_fleet_binaries()
    except (MissingBinaries, FleetError) as exc:
        pytest.fail(str(exc), pytrace=False)
    with fleet_cluster(Path(tempfile.mkdtemp(prefix="ew-fleet-")), NODES) as f:
        yield AgentFleet(f, f.deploy_agents())
