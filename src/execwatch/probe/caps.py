"""The agent's capabilities, for a non-root agent as much as for root.

A non-root process loses its capabilities at execve unless the file it runs grants
them: the agent's image gives its interpreter *permitted* file capabilities (no
effective bit, so an exec under a narrower bounding set, like the handler's, still
works). Those must then be raised to effective by the process itself, here.
"""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

CAP_DAC_READ_SEARCH = 2
CAP_SYS_PTRACE = 19
CAP_SYS_RESOURCE = 24
CAP_PERFMON = 38
CAP_BPF = 39
CAP_SETPCAP = 8
_VERSION_3 = 0x20080522  # _LINUX_CAPABILITY_VERSION_3: two 32-bit words per set
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4


class _Header(ctypes.Structure):
    _fields_ = (("version", ctypes.c_uint32), ("pid", ctypes.c_int))


class _Data(ctypes.Structure):
    _fields_ = (
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    )


def effective() -> int:
    """This process's effective capability set, as a bit mask."""
    status = Path("/proc/self/status").read_text()
    found = re.search(r"^CapEff:\s*([0-9a-f]+)$", status, re.M)
    return int(found.group(1), 16) if found else 0


def raise_permitted() -> None:
    """Make every permitted capability effective (what a file's effective bit would do)."""
    libc = ctypes.CDLL(None, use_errno=True)
    header = _Header(_VERSION_3, 0)
    data = (_Data * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        return
    if all(d.effective == d.permitted for d in data):
        return
    for d in data:
        d.effective = d.permitted
    libc.capset(ctypes.byref(header), data)


def has(mask: int, *caps: int) -> bool:
    return all(mask >> cap & 1 for cap in caps)


def confine(keep: frozenset[int]) -> None:
    """Keep only the capabilities `keep` (of those this process has), for good: no_new_privs,
    the others out of the bounding set (where CAP_SETPCAP allows), the ambient set cleared,
    and effective = permitted = what is kept; nothing inheritable. Raises OSError if the
    kernel refuses, so a caller never runs on believing it is confined."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    if has(effective(), CAP_SETPCAP):
        last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
        for cap in range(last + 1):
            if cap not in keep and libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), f"prctl(PR_CAPBSET_DROP, {cap})")
    header = _Header(_VERSION_3, 0)
    data = (_Data * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    for word, d in enumerate(data):
        mask = sum(1 << (cap - 32 * word) for cap in keep if cap // 32 == word)
        d.permitted &= mask
        d.effective = d.permitted
        d.inheritable = 0
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")
