"""Where a container's root filesystem is mounted on the host, from its container id.

When a container's entrypoint fails, its only process exits and no task is left whose
/proc/PID/root shows the image. The runtime keeps the rootfs mounted a little longer:
containerd (and Docker through it) mounts it at a path that contains the container id;
CRI-O records it in the container's config.json. Candidates are only suggestions:
RootLocator accepts one only if it is the very root directory the kernel reported.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

CONTAINER_ID = re.compile(r"^[0-9a-f]{12,128}$")
CRIO_CONFIG = "/run/containers/storage/overlay-containers/{id}/userdata/config.json"


class ContainerRootfs:
    """Looks in the host's mount table and in CRI-O's state.

    The host is seen through init's view (/proc/1, as a hostPID agent must), or through
    our own when init is out of reach (execwatch trace on a host, or a sandboxed init)."""

    def __init__(self, host_root: Path | None = None, mountinfo: Path | None = None) -> None:
        if host_root is None:
            init_visible = os.access("/proc/1/root/", os.X_OK)
            host_root = Path("/proc/1/root" if init_visible else "/")
            mountinfo = mountinfo or Path(
                "/proc/1/mountinfo" if init_visible else "/proc/self/mountinfo"
            )
        self._host_root = host_root
        self._mountinfo = mountinfo or Path("/proc/self/mountinfo")

    def candidates(self, container_id: str | None) -> Iterator[Path]:
        if not container_id or not CONTAINER_ID.fullmatch(container_id):
            return
        yield from self._from_mounts(container_id)
        yield from self._from_crio(container_id)

    def _from_mounts(self, container_id: str) -> Iterator[Path]:
        try:
            lines = self._mountinfo.read_text(errors="surrogateescape").splitlines()
        except OSError:
            return
        for line in lines:
            fields = line.split(" ", 5)
            if len(fields) > 4 and f"/{container_id}/" in fields[4] + "/":
                yield self._host(fields[4].replace("\\040", " "))

    def _from_crio(self, container_id: str) -> Iterator[Path]:
        config = self._host(CRIO_CONFIG.format(id=container_id))
        try:
            root = json.loads(config.read_text())["root"]["path"]
        except (OSError, ValueError, KeyError, TypeError):
            return
        if isinstance(root, str) and root.startswith("/"):
            yield self._host(root)

    def _host(self, path: str) -> Path:
        return self._host_root / path.lstrip("/")
