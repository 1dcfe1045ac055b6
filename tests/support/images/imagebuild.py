"""Assemble layers, OCI layouts and docker-save archives in tests, with Python's tarfile.

Layers are described entry by entry so a test says exactly what each layer adds, deletes
(whiteouts, opaque directories) or links; real files are added from disk with `tree()`.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zstandard


@dataclass
class Entry:
    path: str
    kind: str = "file"  # file, dir, symlink, hardlink, chr, fifo
    data: bytes = b""
    mode: int = 0o755
    link: str = ""


def file(path: str, data: bytes, mode: int = 0o755) -> Entry:
    return Entry(path, "file", data, mode)


def symlink(path: str, target: str) -> Entry:
    return Entry(path, "symlink", link=target)


def hardlink(path: str, target: str) -> Entry:
    return Entry(path, "hardlink", link=target)


def directory(path: str) -> Entry:
    return Entry(path, "dir")


def tree(root: Path, prefix: str = "", skip: tuple[str, ...] = ("usr/share",)) -> list[Entry]:
    """Every file, directory and symlink under `root`, as layer entries."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        rel_dir = os.path.relpath(dirpath, root)
        if any(rel_dir == s or rel_dir.startswith(s + "/") for s in skip):
            dirnames[:] = []
            continue
        for name in [*dirnames, *sorted(filenames)]:
            full = Path(dirpath, name)
            rel = os.path.normpath(os.path.join(prefix, rel_dir, name))
            if full.is_symlink():
                out.append(symlink(rel, os.readlink(full)))
            elif full.is_dir():
                out.append(directory(rel))
            else:
                out.append(file(rel, full.read_bytes(), full.stat().st_mode & 0o7777))
    return out


def usrmerge(root: Path) -> list[Entry]:
    """The merged-/usr symlinks that Debian's base-files provides, where the tree lacks them."""
    links = []
    for name in ("bin", "sbin", "lib", "lib64"):
        if not (root / name).exists() and (root / "usr" / name).exists():
            links.append(symlink(name, f"usr/{name}"))
    return links


def layer_tar(entries: list[Entry]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for e in entries:
            info = tarfile.TarInfo(e.path)
            info.mode = e.mode
            if e.kind == "file":
                info.size = len(e.data)
                tar.addfile(info, io.BytesIO(e.data))
                continue
            info.type = {
                "dir": tarfile.DIRTYPE,
                "symlink": tarfile.SYMTYPE,
                "hardlink": tarfile.LNKTYPE,
                "chr": tarfile.CHRTYPE,  # /dev/null's numbers
                "fifo": tarfile.FIFOTYPE,
            }[e.kind]
            info.devmajor, info.devminor = (1, 3) if e.kind == "chr" else (0, 0)
            info.linkname = e.link
            tar.addfile(info)
    return buf.getvalue()


def compress(data: bytes, how: str) -> bytes:
    if how == "gzip":
        return gzip.compress(data, compresslevel=1)
    if how == "zstd":
        return zstandard.ZstdCompressor(level=1).compress(data)
    return data


MEDIA = {
    "none": "application/vnd.oci.image.layer.v1.tar",
    "gzip": "application/vnd.oci.image.layer.v1.tar+gzip",
    "zstd": "application/vnd.oci.image.layer.v1.tar+zstd",
}


@dataclass
class Image:
    """One platform's image: layers (lists of entries) and config fields."""

    layers: list[list[Entry]]
    architecture: str = "amd64"
    os: str = "linux"
    variant: str | None = None
    entrypoint: list[str] | None = None
    cmd: list[str] | None = None
    env: list[str] = field(default_factory=list)
    workdir: str = ""
    user: str = ""
    compression: str = "gzip"

    def config(self) -> dict[str, Any]:
        cfg: dict[str, Any] = {"Env": self.env}
        if self.entrypoint is not None:
            cfg["Entrypoint"] = self.entrypoint
        if self.cmd is not None:
            cfg["Cmd"] = self.cmd
        if self.workdir:
            cfg["WorkingDir"] = self.workdir
        if self.user:
            cfg["User"] = self.user
        out: dict[str, Any] = {
            "architecture": self.architecture,
            "os": self.os,
            "config": cfg,
            "rootfs": {"type": "layers", "diff_ids": []},
        }
        if self.variant:
            out["variant"] = self.variant
        return out

    def platform(self) -> dict[str, str]:
        p = {"os": self.os, "architecture": self.architecture}
        if self.variant:
            p["variant"] = self.variant
        return p


class Blobs:
    """A content-addressed blob directory (an OCI layout's blobs/sha256)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)

    def put(self, data: bytes, media_type: str) -> dict[str, Any]:
        digest = hashlib.sha256(data).hexdigest()
        (self.root / "blobs" / "sha256" / digest).write_bytes(data)
        return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data)}

    def put_json(self, doc: Any, media_type: str) -> dict[str, Any]:
        return self.put(json.dumps(doc).encode(), media_type)


def add_image(blobs: Blobs, image: Image, media_override: str | None = None) -> dict[str, Any]:
    """Store config, layers and manifest; return the manifest descriptor (with platform)."""
    layers = []
    for entries in image.layers:
        data = compress(layer_tar(entries), image.compression)
        layers.append(blobs.put(data, media_override or MEDIA[image.compression]))
    config = blobs.put_json(image.config(), "application/vnd.oci.image.config.v1+json")
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config,
        "layers": layers,
    }
    desc = blobs.put_json(manifest, "application/vnd.oci.image.manifest.v1+json")
    desc["platform"] = image.platform()
    return desc


def attestation(blobs: Blobs, subject: dict[str, Any]) -> dict[str, Any]:
    """A BuildKit-style attestation manifest (platform unknown/unknown) for `subject`."""
    statement = blobs.put(
        b'{"_type": "https://in-toto.io/Statement/v0.1"}', "application/vnd.in-toto+json"
    )
    config = blobs.put_json({}, "application/vnd.oci.image.config.v1+json")
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": config, "layers": [statement]}  # fmt: skip
    desc = blobs.put_json(manifest, "application/vnd.oci.image.manifest.v1+json")
    desc["platform"] = {"os": "unknown", "architecture": "unknown"}
    desc["annotations"] = {
        "vnd.docker.reference.type": "attestation-manifest",
        "vnd.docker.reference.digest": subject["digest"],
    }
    return desc


def oci_layout(root: Path, images: list[Image], nested: bool = False, attest: bool = False) -> Path:
    """Write an OCI layout; several images become a multi-platform index."""
    blobs = Blobs(root)
    descs = [add_image(blobs, image) for image in images]
    if attest:
        descs += [attestation(blobs, d) for d in descs]
    if len(images) > 1 or nested or attest:
        index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                 "manifests": descs}  # fmt: skip
        inner = blobs.put_json(index, "application/vnd.oci.image.index.v1+json")
        inner["annotations"] = {"org.opencontainers.image.ref.name": "test:latest"}
        descs = [inner]
    top = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
           "manifests": descs}  # fmt: skip
    (root / "index.json").write_text(json.dumps(top))
    (root / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    return root


def tar_directory(src: Path, out: Path, extra: dict[str, bytes] | None = None) -> Path:
    with tarfile.open(out, "w") as tar:
        for path in sorted(src.rglob("*")):
            if path.is_file():
                tar.add(path, arcname=str(path.relative_to(src)))
        for name, data in (extra or {}).items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out


def docker25_archive(work: Path, image: Image, out: Path) -> Path:
    """What `docker save` writes since Docker 25: an OCI layout plus a legacy manifest.json."""
    layout = work / "docker25"
    blobs = Blobs(layout)
    desc = add_image(blobs, image)
    manifest = json.loads((layout / "blobs/sha256" / desc["digest"][7:]).read_text())
    del desc["platform"]  # docker save does not put a platform on a single-image index
    desc["annotations"] = {"io.containerd.image.name": "docker.io/library/test:latest"}
    (layout / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [desc]}))
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    layers = ["blobs/sha256/" + ld["digest"][7:] for ld in manifest["layers"]]
    config = "blobs/sha256/" + manifest["config"]["digest"][7:]
    legacy = [{"Config": config, "RepoTags": ["test:latest"], "Layers": layers}]
    (layout / "manifest.json").write_text(json.dumps(legacy))
    return tar_directory(layout, out)


def legacy_docker_archive(image: Image, out: Path) -> Path:
    """The pre-25 `docker save` format: <id>/layer.tar (uncompressed), <config>.json."""
    with tarfile.open(out, "w") as tar:

        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))

        layer_names = []
        for i, entries in enumerate(image.layers):
            name = f"{i:064x}/layer.tar"
            add(name, layer_tar(entries))
            layer_names.append(name)
        config = json.dumps(image.config()).encode()
        config_name = hashlib.sha256(config).hexdigest() + ".json"
        add(config_name, config)
        manifest = [{"Config": config_name, "RepoTags": ["legacy:1"], "Layers": layer_names}]
        add("manifest.json", json.dumps(manifest).encode())
    return out
