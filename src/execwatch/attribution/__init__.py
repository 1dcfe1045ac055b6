"""Attribution: which container, pod and workload a failed exec came from.

``Attributor.resolve(cgroup_id, pid)`` is the one entry point; see docs/attribution.md.
The Attributor is loaded on first use: it brings gRPC (the CRI client), which the
handler, importing only the metadata rules, should not pay for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from execwatch.attribution.cgroup_layout import CgroupKind, CgroupLayout, parse_cgroup_path
from execwatch.attribution.metadata import ContainerMeta, PodMeta, PodSource, WorkloadRef

if TYPE_CHECKING:
    from execwatch.attribution.attributor import Attributor, AttributorConfig

__all__ = [
    "Attributor",
    "AttributorConfig",
    "CgroupKind",
    "CgroupLayout",
    "ContainerMeta",
    "PodMeta",
    "PodSource",
    "WorkloadRef",
    "parse_cgroup_path",
]


def __getattr__(name: str) -> Any:
    if name in ("Attributor", "AttributorConfig"):
        from execwatch.attribution import attributor

        return getattr(attributor, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
