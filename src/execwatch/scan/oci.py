"""The one walk of an OCI index or manifest, over any store of blobs by digest.

A layout directory, an image archive and a registry each answer the `BlobStore` protocol:
a manifest or index by digest, a config by digest and declared size, a layer's opener,
each bounded and checked against its digest by the store. The walk holds every check of
the structure, the same for every store:

- an index's children are followed to `Limits.max_index_depth` levels of index (the top
  one is level 0) and to `Limits.max_manifests` manifests in all; attestation manifests,
  repeated digests and platforms not asked for are skipped;
- every digest has the OCI form before any use (`valid_digest`);
- a config and each layer declare a size (`declared_size`): a config is read to that
  size and checked against its digest, a layer is read to one byte past it at most;
- a layer has one of the layer media types.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import IO, Any, Protocol

from execwatch.binfmt import Platform
from execwatch.runnable.limits import Limits
from execwatch.scan.bounded import parse_json
from execwatch.scan.errors import ScanInputError
from execwatch.scan.sources import (
    INDEX_TYPES,
    LAYER_TYPES,
    MANIFEST_TYPES,
    FileStore,
    ImageSource,
    Layer,
    check_digest,
    declared_size,
    descriptor_platform,
    docker_images,
    is_attestation,
    valid_digest,
)

REF_NAME = "org.opencontainers.image.ref.name"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"


class BlobStore(Protocol):
    """Where the walk reads an image's blobs; every read bounded and digest-checked."""

    @property
    def label(self) -> str:
        """The source, as messages name it."""
        ...

    def manifest(self, digest: str) -> dict[str, Any]:
        """The manifest or index of this (valid) digest, within `Limits.max_json_bytes`,
        checked against the digest; its `mediaType` as the store serves it."""
        ...

    def config(self, digest: str, size: int) -> Any:
        """The JSON blob of this digest and declared size, read to that size at most and
        checked against both."""
        ...

    def opener(self, digest: str, size: int) -> Callable[[], IO[bytes]]:
        """How a layer's bytes are opened when it is scanned."""
        ...

    def image_label(self, digest: str, ref_name: str | None) -> str:
        """What an image of this manifest digest is called in the report."""
        ...


def walk(
    store: BlobStore,
    top: dict[str, Any],
    digest: str | None,
    limits: Limits,
    platforms: Collection[Platform] | None = None,
) -> list[ImageSource]:
    """Every image manifest `top` (an index or a manifest of `digest`) leads to: of every
    platform, or of the first manifest of an index that declares each of `platforms` (and
    of those that declare none, which may be any); layers are opened only when scanned."""
    walker = _Walk(store, limits, platforms)
    walker.node(top, digest, None, None, depth=0)
    return walker.out


@dataclass
class _Walk:
    store: BlobStore
    limits: Limits
    platforms: Collection[Platform] | None
    out: list[ImageSource] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)

    def fail(self, what: str) -> ScanInputError:
        return ScanInputError(f"{self.store.label}: {what}")

    def node(
        self,
        doc: dict[str, Any],
        digest: str | None,
        desc: dict[str, Any] | None,
        name: str | None,
        depth: int,
    ) -> None:
        own = doc.get("mediaType")
        media_type = own if isinstance(own, str) else (desc or {}).get("mediaType")
        if media_type in MANIFEST_TYPES or (media_type is None and "layers" in doc):
            self.out.append(self.image(doc, str(digest or ""), desc, name))
        elif media_type in INDEX_TYPES or (media_type is None and "manifests" in doc):
            self.index(doc, name, depth)
        else:
            raise self.fail(f"unsupported manifest media type {str(media_type)[:80]!r}")

    def index(self, doc: dict[str, Any], name: str | None, depth: int) -> None:
        if depth >= self.limits.max_index_depth:
            raise self.fail(f"indexes nested deeper than {self.limits.max_index_depth}")
        manifests = doc.get("manifests")
        if not isinstance(manifests, list):
            raise self.fail("index has no manifests list")
        for child in manifests:
            if not isinstance(child, dict):
                raise self.fail("malformed descriptor in index")
            digest = valid_digest(child.get("digest"), f"{self.store.label}: index")
            if is_attestation(child) or digest in self.seen or self.skips(child):
                continue
            self.seen.add(digest)
            if len(self.seen) > self.limits.max_manifests:
                raise self.fail(f"more than {self.limits.max_manifests} manifests")
            body = self.store.manifest(digest)
            self.node(body, digest, child, name or _ref_name(child), depth + 1)

    def skips(self, desc: dict[str, Any]) -> bool:
        """An index entry of a platform not asked for, or of one already found."""
        declared = descriptor_platform(desc)
        if self.platforms is None or declared is None:
            return False
        if not any(declared.matches(p) for p in self.platforms):
            return True
        return any(i.platform is not None and i.platform.matches(declared) for i in self.out)

    def image(
        self, manifest: dict[str, Any], digest: str, desc: dict[str, Any] | None, name: str | None
    ) -> ImageSource:
        short = digest[:19]
        config_desc = manifest.get("config")
        if not isinstance(config_desc, dict):
            raise self.fail(f"manifest {short} has no config")
        what = f"{self.store.label}: config of {short}"
        config_digest = valid_digest(config_desc.get("digest"), what)
        config = self.store.config(config_digest, declared_size(config_desc.get("size"), what))
        if not isinstance(config, dict):
            raise self.fail(f"config of {short} is not an object")
        layers_desc = manifest.get("layers")
        if not isinstance(layers_desc, list) or len(layers_desc) > self.limits.max_layers:
            raise self.fail(f"manifest {short} has no usable layers list")
        layers = [self.layer(ld) for ld in layers_desc]
        label = self.store.image_label(digest, name)
        return ImageSource(label, descriptor_platform(desc or {}), config, layers, digest or None)

    def layer(self, desc: object) -> Layer:
        if not isinstance(desc, dict):
            raise self.fail("malformed layer descriptor")
        digest = valid_digest(desc.get("digest"), f"{self.store.label}: layer")
        media_type = desc.get("mediaType")
        if media_type not in LAYER_TYPES:
            raise self.fail(f"unknown layer media type {media_type!r}")
        size = declared_size(desc.get("size"), f"{self.store.label}: layer {digest[:19]}")
        return Layer(digest, media_type, digest, self.store.opener(digest, size), size)


def _ref_name(desc: dict[str, Any]) -> str | None:
    annotations = desc.get("annotations")
    name = annotations.get(REF_NAME) if isinstance(annotations, dict) else None
    return name if isinstance(name, str) else None


@dataclass(frozen=True)
class LayoutBlobs:
    """The blobs of an OCI layout, in a directory or an image archive (blobs/<alg>/<hex>)."""

    files: FileStore
    limits: Limits

    @property
    def label(self) -> str:
        return self.files.label

    def manifest(self, digest: str) -> dict[str, Any]:
        doc = self.files.json(self.files.blob_path(digest), self.limits, digest)
        if not isinstance(doc, dict):
            raise ScanInputError(f"{self.label}: manifest {digest[:19]} is not an object")
        return doc

    def config(self, digest: str, size: int) -> Any:
        what = f"{self.label}: blob {digest[:80]}"
        if size > self.limits.max_json_bytes:
            raise ScanInputError(f"{what} larger than {self.limits.max_json_bytes}")
        with self.files.open(self.files.blob_path(digest)) as f:
            raw = f.read(size + 1)
        if len(raw) != size:
            raise ScanInputError(f"{what}: {len(raw)} bytes or more, {size} declared")
        check_digest(raw, digest, what)
        return parse_json(raw, what, self.limits)

    def opener(self, digest: str, size: int) -> Callable[[], IO[bytes]]:
        path = self.files.blob_path(digest)
        return lambda: self.files.open(path)

    def image_label(self, digest: str, ref_name: str | None) -> str:
        return f"{self.label}{'#' + ref_name if ref_name else ''}@{digest[:19]}"


def oci_images(files: FileStore, limits: Limits) -> list[ImageSource]:
    """Every image manifest reachable from index.json, nested indexes included."""
    layout = files.json("oci-layout", limits)
    if not isinstance(layout, dict) or "imageLayoutVersion" not in layout:
        raise ScanInputError(f"{files.label}: oci-layout has no imageLayoutVersion")
    index = files.json("index.json", limits)
    if not isinstance(index, dict) or index.setdefault("mediaType", OCI_INDEX) not in INDEX_TYPES:
        raise ScanInputError(f"{files.label}: index.json is not an image index")
    return walk(LayoutBlobs(files, limits), index, None, limits)


def images_in_store(files: FileStore, limits: Limits) -> list[ImageSource]:
    """Docker 25+ archives hold both formats: the OCI index says more (platforms, nesting)."""
    if files.exists("oci-layout") and files.exists("index.json"):
        return oci_images(files, limits)
    if files.exists("manifest.json"):
        return docker_images(files, limits)
    raise ScanInputError(f"{files.label}: neither an OCI layout nor a docker-save archive")
