"""/proc/PID/cgroup: the fallback for hosts where the cgroup id alone says too little.

On a hybrid host whose runtime never joins the unified hierarchy, and on pure v1
hosts, every container shares one v2 cgroup and its id names no container; while the
task lives, its v1 paths still do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

# Which v1 hierarchy to believe first: runtimes create container cgroups in all of them,
# but name=systemd and pids are the ones present on nearly every v1 host.
V1_PREFERENCE = ("name=systemd", "pids", "memory", "cpu", "cpuacct", "devices", "freezer")


@dataclass(frozen=True, slots=True)
class ProcCgroups:
    unified: str | None = None
    v1: dict[str, str] = field(default_factory=dict)  # controller or name=x -> path

    def v1_paths(self) -> list[str]:
        """Distinct v1 paths, the preferred hierarchies first."""
        ordered = [self.v1[k] for k in V1_PREFERENCE if k in self.v1]
        ordered += [p for k, p in sorted(self.v1.items()) if k not in V1_PREFERENCE]
        return list(dict.fromkeys(ordered))


def parse_proc_cgroup(text: str) -> ProcCgroups:
    unified: str | None = None
    v1: dict[str, str] = {}
    for line in text.splitlines():
        hierarchy, sep, rest = line.partition(":")
        controllers, sep2, path = rest.partition(":")
        if not sep or not sep2 or not path.startswith("/"):
            continue
        if hierarchy == "0" and controllers == "":
            unified = path
            continue
        for controller in controllers.split(","):
            if controller:
                v1[controller] = path
    return ProcCgroups(unified, v1)


def read_proc_cgroup(pid: int, proc: Path = Path("/proc")) -> ProcCgroups | None:
    try:
        return parse_proc_cgroup((proc / str(pid) / "cgroup").read_text())
    except (OSError, ValueError):
        return None
