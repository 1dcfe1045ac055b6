"""Where the cgroup hierarchies are mounted, read from /proc/self/mountinfo.

Nodes differ: pure cgroup v2 at /sys/fs/cgroup, hybrid hosts with v2 at
/sys/fs/cgroup/unified and v1 controllers beside it, and containers whose
cgroup mount shows only a subtree (the mountinfo ``root`` field).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

MOUNTINFO = Path("/proc/self/mountinfo")


@dataclass(frozen=True, slots=True)
class HierarchyMount:
    """One mounted cgroup hierarchy: ``mountpoint`` shows the hierarchy's ``root`` subtree."""

    mountpoint: Path
    root: str = "/"

    def to_hierarchy_path(self, fs_path: str | Path) -> str | None:
        """Absolute file-system path under the mount -> path inside the hierarchy."""
        try:
            rel = Path(fs_path).relative_to(self.mountpoint)
        except ValueError:
            return None
        joined = "/" + "/".join(p for p in (self.root.strip("/"), str(rel)) if p and p != ".")
        return joined

    def to_fs_path(self, hierarchy_path: str) -> Path | None:
        """Path inside the hierarchy -> file-system path, if this mount shows it."""
        root = self.root.rstrip("/")
        if root and hierarchy_path != root and not hierarchy_path.startswith(root + "/"):
            return None
        rel = hierarchy_path[len(root) :].strip("/")
        return self.mountpoint / rel if rel else self.mountpoint


@dataclass(frozen=True, slots=True)
class CgroupMounts:
    unified: HierarchyMount | None = None
    v1: dict[str, HierarchyMount] = field(default_factory=dict)  # controller or name=x -> mount


def unescape_mountinfo(field_: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal."""
    out, i = [], 0
    while i < len(field_):
        octal = field_[i + 1 : i + 4]
        if field_[i] == "\\" and len(octal) == 3 and all(c in "01234567" for c in octal):
            out.append(chr(int(octal, 8)))
            i += 4
        else:
            out.append(field_[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> CgroupMounts:
    """Pick the cgroup mounts. With several v2 mounts, prefer the one showing the whole tree."""
    unified: list[HierarchyMount] = []
    v1: dict[str, HierarchyMount] = {}
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields or len(fields) < 9:
            continue
        sep = fields.index("-")
        if sep < 6 or sep + 3 >= len(fields):
            continue
        fstype, superopts = fields[sep + 1], fields[sep + 3]
        mount = HierarchyMount(Path(unescape_mountinfo(fields[4])), unescape_mountinfo(fields[3]))
        if fstype == "cgroup2":
            unified.append(mount)
        elif fstype == "cgroup":
            for opt in superopts.split(","):
                if opt in ("rw", "ro") or opt.startswith(("release_agent", "clone_children")):
                    continue
                v1.setdefault(opt, mount)
    unified.sort(key=lambda m: (m.root != "/", str(m.mountpoint) != "/sys/fs/cgroup"))
    return CgroupMounts(unified[0] if unified else None, v1)


def cgroup_mounts(mountinfo: Path = MOUNTINFO) -> CgroupMounts:
    return parse_mountinfo(mountinfo.read_text())
