"""Podman's containers from its on-disk state (containers/storage), where no service runs.

`overlay-containers/containers.json` lists each container: its names, its image id, its
own layer and a metadata string holding the image as typed; `overlay-layers/layers.json`
chains each layer to its parent; `overlay/<layer>/diff` holds a layer's files. Rootful
Podman keeps them under /var/lib/containers/storage, a rootless user under
~/.local/share/containers/storage. Compose labels live in Podman's own database, which is
not read. Files are read whole, at most 16 MiB each, on the caller's thread.
"""

from __future__ import annotations

import json
import os
import pwd
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from execwatch.attribution.engine_api import MAX_LAYERS, EngineContainer, Layers

ROOTFUL_GRAPH_ROOT = Path("/var/lib/containers/storage")
ROOTLESS_GRAPH_ROOT = ".local/share/containers/storage"  # in the user's home
MAX_STATE_BYTES = 16 << 20
DRIVER = "overlay"


@dataclass(frozen=True, slots=True)
class PodmanStorage:
    graph_root: Path

    @classmethod
    def of_user(cls, uid: int) -> PodmanStorage | None:
        try:
            home = pwd.getpwuid(uid).pw_dir
        except KeyError:
            return None
        return cls(Path(home) / ROOTLESS_GRAPH_ROOT)

    def container(self, container_id: str) -> EngineContainer | None:
        containers = _read_list(self.graph_root / f"{DRIVER}-containers" / "containers.json")
        entry = next((c for c in containers if c.get("id") == container_id), None)
        if entry is None:
            return None
        metadata = _metadata(entry.get("metadata"))
        names = entry.get("names")
        name = names[0] if isinstance(names, list) and names else metadata.get("name")
        image_id = entry.get("image")
        return EngineContainer(
            container_id=container_id,
            name=name if isinstance(name, str) else None,
            image=_str(metadata.get("image-name")),
            image_id=image_id if isinstance(image_id, str) else None,
            layers=self._layers(entry.get("layer")),
            inspected=True,
        )

    def _layers(self, top: Any) -> Layers | None:
        if not isinstance(top, str):
            return None
        parents = {
            layer["id"]: layer.get("parent")
            for layer in _read_list(self.graph_root / f"{DRIVER}-layers" / "layers.json")
            if isinstance(layer.get("id"), str)
        }
        chain: list[str] = []
        layer: Any = top
        while isinstance(layer, str) and layer in parents and len(chain) < MAX_LAYERS:
            if "/" in layer or layer in (".", ".."):
                return None
            chain.append(str(self.graph_root / DRIVER / layer / "diff"))
            layer = parents[layer]
        return Layers(None, tuple(chain)) if chain else None


def _read_list(path: Path) -> list[dict[str, Any]]:
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size > MAX_STATE_BYTES:
                return []
            data = json.loads(f.read(MAX_STATE_BYTES))
    except (OSError, ValueError, RecursionError):
        return []
    return [d for d in data if isinstance(d, dict)] if isinstance(data, list) else []


def _metadata(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, str) or len(raw) > 1 << 16:
        return {}
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None
