"""Attribution: which container, pod and workload a failed exec came from.

``Attributor.resolve(cgroup_id, pid)`` is the one entry point; see docs/attribution.md.
"""

from execwatch.attribution.attributor import Attributor, AttributorConfig
from execwatch.attribution.layout import CgroupKind, CgroupLayout, parse_cgroup_path
from execwatch.attribution.metadata import ContainerMeta, PodMeta, PodSource, Workload

__all__ = [
    "Attributor",
    "AttributorConfig",
    "CgroupKind",
    "CgroupLayout",
    "ContainerMeta",
    "PodMeta",
    "PodSource",
    "Workload",
    "parse_cgroup_path",
]
