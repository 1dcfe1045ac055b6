"""Resource limits for the child processes that do work a tenant can make expensive
(diagnosis workers, scans): what they may add on top of what they inherited."""

from __future__ import annotations

import math
import resource


def address_space() -> int:
    """This process's address space now (VmSize), in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def set_soft(which: int, soft: int) -> None:
    """Lower (or raise, up to the hard limit) the soft limit of `which`."""
    _, hard = resource.getrlimit(which)
    resource.setrlimit(which, (soft if hard == resource.RLIM_INFINITY else min(hard, soft), hard))


def limit_memory(extra: int) -> None:
    """RLIMIT_AS: what the process has now plus `extra` bytes."""
    set_soft(resource.RLIMIT_AS, address_space() + extra)


def limit_cpu(seconds: int) -> None:
    """RLIMIT_CPU counts a process's whole life: `seconds` more from now."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    set_soft(resource.RLIMIT_CPU, math.ceil(usage.ru_utime + usage.ru_stime) + seconds)
