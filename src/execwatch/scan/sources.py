"""Turn a command-line target into images: OCI layouts, docker-save/OCI tarballs, rootfs, files.

An `ImageSource` is one platform's manifest: its config and its layers, each layer opened
lazily. The OCI index and manifests are walked by `scan.oci`; every name taken from the input
(digests, archive paths) is validated before it is used as a path.
"""

from __future__ import annotations

import hashlib
import io
import os
import posixpath
import re
import stat
import tarfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import IO, Any, Literal

from execwatch.binfmt import Platform
from execwatch.runnable.limits import Limits
from execwatch.scan.bounded import (
    CHUNK,
    GZIP_MAGIC,
    ZSTD_MAGIC,
    Readable,
    Tally,
    check_tar_end,
    decompressed,
    parse_json,
)
from execwatch.scan.errors import CorruptInput, LimitExceeded, ScanInputError

INDEX_TYPES = {
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
}
MANIFEST_TYPES = {
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
}
LAYER_TYPES = {
    "application/vnd.oci.image.layer.v1.tar",
    "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.oci.image.layer.v1.tar+zstd",
    "application/vnd.oci.image.layer.nondistributable.v1.tar",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd",
    "application/vnd.docker.image.rootfs.diff.tar",
    "application/vnd.docker.image.rootfs.diff.tar.gzip",
    "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip",
}
_DIGEST = re.compile(r"sha256:[a-f0-9]{64}|sha512:[a-f0-9]{128}")
ATTESTATION = "attestation-manifest"


@dataclass
class Layer:
    name: str
    media_type: str | None
    digest: str | None
    open: Callable[[], IO[bytes]]
    size: int | None = None  # as its descriptor declares it: reading stops one byte past


@dataclass
class ImageBudget:
    """What one image may cost: wall time and bytes read from its source.

    The one place every per-image loop asks (layer reads, tar members): a registry that
    drips bytes, a layer that never ends or a tree that takes hours stops at the first
    check past the deadline, with a LimitExceeded naming the image.
    """

    label: str
    seconds: float
    max_bytes: int
    deadline: float = 0.0
    bytes: int = 0

    @classmethod
    def start(cls, label: str, limits: Limits) -> ImageBudget:
        seconds = limits.max_image_seconds
        return cls(label, seconds, limits.max_image_bytes, time.monotonic() + seconds)

    def charge(self, n: int = 0) -> None:
        self.bytes += n
        if self.bytes > self.max_bytes:
            raise LimitExceeded(f"{self.label}: more than {self.max_bytes} bytes read")
        if time.monotonic() > self.deadline:
            raise LimitExceeded(f"{self.label}: not scanned within {self.seconds:g} s")


@dataclass
class ImageSource:
    """One image (one platform) to scan."""

    label: str
    platform: Platform | None
    config: dict[str, Any]
    layers: list[Layer] = field(default_factory=list)
    digest: str | None = None  # the manifest's digest; for a legacy docker save, the image ID

    def config_platform(self) -> Platform | None:
        arch = self.config.get("architecture")
        if not isinstance(arch, str) or not arch:
            return None
        os_name = self.config.get("os") if isinstance(self.config.get("os"), str) else "linux"
        variant = self.config.get("variant")
        return Platform.normalised(
            str(os_name), arch, variant if isinstance(variant, str) else None
        )


class FileStore:
    """Files inside an OCI layout directory or an image archive, by validated relative path."""

    def __init__(self, opener: Callable[[str], IO[bytes] | None], label: str) -> None:
        self._opener = opener
        self.label = label

    def open(self, path: str) -> IO[bytes]:
        clean = safe_relative(path, self.label)
        f = self._opener(clean)
        if f is None:
            raise ScanInputError(f"{self.label}: missing {clean}")
        return f

    def exists(self, path: str) -> bool:
        f = self._opener(safe_relative(path, self.label))
        if f is None:
            return False
        f.close()
        return True

    def blob_path(self, digest: str) -> str:
        algorithm, hexdigest = valid_digest(digest, self.label).split(":", 1)
        return f"blobs/{algorithm}/{hexdigest}"

    def json(self, path: str, limits: Limits, digest: str | None = None) -> Any:
        with self.open(path) as f:
            raw = f.read(limits.max_json_bytes + 1)
        if digest is not None and len(raw) <= limits.max_json_bytes:
            check_digest(raw, digest, f"{self.label}: {path}")
        return parse_json(raw, f"{self.label}: {path}", limits)


def valid_digest(digest: object, what: str) -> str:
    """The digest if it has the OCI form (sha256 or sha512, lowercase hex of the exact
    length): what a path, a URL or a comparison may be built from. Anything else is
    refused before any use, whoever supplied it (a layout, an archive, a registry)."""
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        shown = digest[:80] if isinstance(digest, str) else type(digest).__name__
        raise ScanInputError(f"{what}: invalid digest {shown!r}")
    return digest


def declared_size(value: object, what: str) -> int:
    """A descriptor's `size`: a non-negative integer (a bool is not one)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ScanInputError(f"{what}: descriptor has no valid size: {str(value)[:32]!r}")
    return value


def check_digest(raw: bytes, digest: str, what: str) -> None:
    algorithm, expected = valid_digest(digest, what).split(":", 1)
    if hashlib.new(algorithm, raw).hexdigest() != expected:
        raise ScanInputError(f"{what}: content does not match digest {digest}")


def safe_relative(path: str, label: str) -> str:
    if not isinstance(path, str) or path.startswith("/") or "\0" in path:
        raise ScanInputError(f"{label}: invalid path {path!r}")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        raise ScanInputError(f"{label}: path escapes the image: {path!r}")
    return "/".join(parts)


def directory_store(root: str) -> FileStore:
    real_root = os.path.realpath(root)

    def opener(rel: str) -> IO[bytes] | None:
        path = os.path.realpath(os.path.join(real_root, rel))
        if not path.startswith(real_root + os.sep):
            raise ScanInputError(f"{root}: {rel} resolves outside the layout")
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ScanInputError(f"{root}: {rel}: {exc.strerror}") from exc
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise ScanInputError(f"{root}: {rel} is not a regular file")
        return os.fdopen(fd, "rb")

    return FileStore(opener, root)


@dataclass(frozen=True, slots=True)
class _Member:
    """What locating and following one archive member needs (a TarInfo weighs ~10x more)."""

    offset: int
    type: bytes
    linkname: str


def _member_name(name: str) -> str:
    return "/".join(p for p in name.split("/") if p not in ("", "."))


def _follow(members: dict[str, _Member], rel: str, label: str) -> str | None:
    """The regular member `rel` names, through links; None when it does not exist."""
    name = rel
    for _ in range(16):  # old docker save links duplicate layers: <id>/layer.tar -> ../x/...
        member = members.get(name)
        if member is None:
            return None
        if member.type in (tarfile.SYMTYPE, tarfile.LNKTYPE):
            base = posixpath.dirname(name) if member.type == tarfile.SYMTYPE else ""
            name = posixpath.normpath(safe_relative(posixpath.join(base, member.linkname), label))
            continue
        if member.type not in tarfile.REGULAR_TYPES:
            raise ScanInputError(f"{label}: {rel} is not a regular file")
        return name
    raise ScanInputError(f"{label}: link loop at {rel}")


def archive_store(tar: tarfile.TarFile, label: str) -> FileStore:
    """An uncompressed image archive, read at random (members are seeked to)."""
    infos = {_member_name(m.name): m for m in tar.getmembers()}
    members = {name: _Member(m.offset, m.type, m.linkname) for name, m in infos.items()}

    def opener(rel: str) -> IO[bytes] | None:
        name = _follow(members, rel, label)
        return None if name is None else tar.extractfile(infos[name])

    return FileStore(opener, label)


def descriptor_platform(desc: dict[str, Any]) -> Platform | None:
    p = desc.get("platform")
    if not isinstance(p, dict):
        return None
    arch, os_name = p.get("architecture"), p.get("os")
    if not isinstance(arch, str) or not isinstance(os_name, str):
        return None
    variant = p.get("variant") if isinstance(p.get("variant"), str) else None
    return Platform.normalised(os_name, arch, variant)


def is_attestation(desc: dict[str, Any]) -> bool:
    annotations = desc.get("annotations")
    if (
        isinstance(annotations, dict)
        and annotations.get("vnd.docker.reference.type") == ATTESTATION
    ):
        return True
    p = desc.get("platform")
    return isinstance(p, dict) and p.get("os") == "unknown" and p.get("architecture") == "unknown"


def _opener(store: FileStore, path: str) -> Callable[[], IO[bytes]]:
    return lambda: store.open(path)


def docker_images(store: FileStore, limits: Limits) -> list[ImageSource]:
    """The legacy `docker save` manifest.json (before Docker 25, or without an OCI index)."""
    manifest = store.json("manifest.json", limits)
    if not isinstance(manifest, list):
        raise ScanInputError(f"{store.label}: manifest.json is not a list")
    if len(manifest) > limits.max_manifests:
        raise LimitExceeded(f"{store.label}: more than {limits.max_manifests} images")
    out = []
    for entry in manifest:
        if not isinstance(entry, dict) or not isinstance(entry.get("Layers"), list):
            raise ScanInputError(f"{store.label}: malformed manifest.json entry")
        if len(entry["Layers"]) > limits.max_layers:
            raise LimitExceeded(f"{store.label}: an image of more than {limits.max_layers} layers")
        config_path = str(entry.get("Config"))
        config = store.json(config_path, limits)
        if not isinstance(config, dict):
            raise ScanInputError(f"{store.label}: config is not an object")
        tags = entry.get("RepoTags") or []
        label = f"{store.label}#{tags[0]}" if tags and isinstance(tags[0], str) else store.label
        layers = [Layer(str(p), None, None, _opener(store, str(p))) for p in entry["Layers"]]
        image_id = "sha256:" + posixpath.basename(config_path).removesuffix(".json")
        digest = image_id if _DIGEST.fullmatch(image_id) else None
        out.append(ImageSource(label, None, config, layers, digest))
    return out


ArchiveKind = Literal["image", "rootfs"]
_IMAGE_MARKERS = ("oci-layout", "index.json", "manifest.json")
_SMALL_MEMBER = 1 << 20  # JSON members kept from the survey: manifests, configs, oci-layout


@dataclass
class ArchiveSurvey:
    """What one streaming pass over an archive's members learnt."""

    kind: ArchiveKind
    members: dict[str, _Member] = field(default_factory=dict)  # image archives only
    small: dict[str, bytes] = field(default_factory=dict)  # metadata, read once


def survey_archive(path: str, limits: Limits) -> ArchiveSurvey:
    """Read an archive once, streaming: an image archive or a rootfs, and where is what?

    Keeps the member table (up to max_archive_members) and the small metadata members
    (manifests, indexes, configs: at most max_json_bytes in all). A truncated or corrupt
    archive fails here, before anything is reported.
    """
    markers: set[str] = set()
    members: dict[str, _Member] = {}
    small: dict[str, bytes] = {}
    small_bytes = count = 0
    with open(path, "rb") as f:
        stream = Tally(decompressed(f, path, limits, [0, 0]))
        tar = tarfile.open(fileobj=stream, mode="r|")  # type: ignore[call-overload]  # noqa: SIM115
        with tar:
            while (member := tar.next()) is not None:
                count += 1
                if count > limits.max_entries:
                    raise LimitExceeded(f"{path}: more than {limits.max_entries} tar entries")
                _forget(tar)
                name = _member_name(member.name)
                if name in _IMAGE_MARKERS:
                    markers.add(name)
                if count > limits.max_archive_members:
                    members.clear()  # a rootfs, or an image archive refused below
                    continue
                members[name] = _Member(member.offset, member.type, member.linkname)
                if (
                    member.isreg()
                    and member.size <= _SMALL_MEMBER
                    and _is_metadata(name)
                    and small_bytes + member.size <= limits.max_json_bytes
                    and (data := _read_json_member(tar, member)) is not None
                ):
                    small_bytes += member.size
                    small[name] = data
            check_tar_end(tar.offset, stream, path)
    if {"oci-layout", "index.json"} <= markers or "manifest.json" in markers:
        if count > limits.max_archive_members:
            raise LimitExceeded(f"{path}: more than {limits.max_archive_members} archive members")
        return ArchiveSurvey("image", members, small)
    return ArchiveSurvey("rootfs")


def _forget(tar: tarfile.TarFile) -> None:
    """tarfile keeps every TarInfo it has read, even in stream mode: drop them."""
    tar.members.clear()  # type: ignore[attr-defined]


def _is_metadata(name: str) -> bool:
    """Top-level files (index.json, manifest.json, <config>.json) and small blobs."""
    return "/" not in name or name.startswith("blobs/")


def _read_json_member(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes | None:
    """The member's bytes if it is JSON (manifests, indexes, configs); layers are not kept."""
    data = tar.extractfile(member)
    if data is None:
        return None
    first = data.read(1)
    return first + data.read() if first in (b"{", b"[") else None


def open_archive(path: str, stack: ExitStack, limits: Limits, survey: ArchiveSurvey) -> FileStore:
    """The blobs of an image archive. An uncompressed one is read at random; a compressed
    one is streamed, never inflated to disk: metadata comes from the survey, and layers
    from a decompression that restarts only when a layer lies before the last one read."""
    f: IO[bytes] = stack.enter_context(open(path, "rb"))  # noqa: SIM115
    magic = f.read(4)
    f.seek(0)
    if magic[:2] == GZIP_MAGIC or magic == ZSTD_MAGIC:
        rewinding = stack.enter_context(_Rewinding(path, limits))
        return FileStore(_streamed_opener(survey, rewinding, path), path)
    try:
        tar = stack.enter_context(tarfile.open(fileobj=f, mode="r:"))  # noqa: SIM115
    except tarfile.TarError as exc:
        raise CorruptInput(f"{path}: not a tar archive: {exc}") from exc
    return archive_store(tar, path)


def _streamed_opener(
    survey: ArchiveSurvey, rewinding: _Rewinding, label: str
) -> Callable[[str], IO[bytes] | None]:
    def opener(rel: str) -> IO[bytes] | None:
        name = _follow(survey.members, rel, label)
        if name is None:
            return None
        if name in survey.small:
            return io.BytesIO(survey.small[name])
        return rewinding.open_at(survey.members[name].offset, name)

    return opener


class _Rewinding:
    """One forward decompression of an archive, started again from its first byte when a
    member before the current position is asked for. All passes share one inflation
    budget (max_uncompressed_bytes), so out-of-order layers cannot multiply the work."""

    def __init__(self, path: str, limits: Limits) -> None:
        self.path = path
        self.limits = limits
        self.counter = [0, 0]
        self.file: IO[bytes] | None = None
        self.tar: tarfile.TarFile | None = None
        self.position = -1

    def __enter__(self) -> _Rewinding:
        return self

    def __exit__(self, *exc: object) -> None:
        self._close()

    def _close(self) -> None:
        if self.tar is not None:
            self.tar.close()
        if self.file is not None:
            self.file.close()
        self.tar = self.file = None

    def open_at(self, offset: int, name: str) -> IO[bytes]:
        if self.tar is None or offset <= self.position:
            self._close()
            self.file = open(self.path, "rb")  # noqa: SIM115
            stream = decompressed(self.file, self.path, self.limits, self.counter)
            self.tar = tarfile.open(fileobj=stream, mode="r|")  # type: ignore[call-overload]  # noqa: SIM115
        assert self.tar is not None
        while (member := self.tar.next()) is not None:
            _forget(self.tar)
            if member.offset == offset:
                self.position = offset
                data = self.tar.extractfile(member)
                if data is None:
                    break
                return data
        raise CorruptInput(f"{self.path}: {name} is no longer where the archive said it was")


ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.zst", ".tzst", ".tar.zstd", ".oci")


def is_archive(path: str) -> bool:
    """Sniffed from the bytes; a file only named like an archive is CorruptInput."""
    with open(path, "rb") as f:
        head = f.read(512)
    if head[:2] == b"\x1f\x8b" or head[:4] == b"\x28\xb5\x2f\xfd":
        return True
    if len(head) == 512 and head[257:262] == b"ustar":
        return True
    if path.lower().endswith(ARCHIVE_SUFFIXES):
        raise CorruptInput(f"{path}: named like an archive but is not a tar, gzip or zstd file")
    return False


@contextmanager
def layer_stream(
    layer: Layer, limits: Limits, counter: list[int], budget: ImageBudget
) -> Iterator[Readable]:
    """Open a layer, decompress it (bounded), and check its digest once fully read.

    Every byte read is charged to the image's budget, and a layer that declares its size
    is read to one byte past it at most: the drain after the tar's end is bounded too."""
    with layer.open() as raw:
        hashing = _Hashing(raw, layer, budget)
        yield decompressed(hashing, layer.name, limits, counter)
        while hashing.read(CHUNK):
            pass
        hashing.verify()


class _Hashing:
    def __init__(self, inner: IO[bytes], layer: Layer, budget: ImageBudget) -> None:
        self.inner = inner
        self.layer = layer
        self.budget = budget
        self.got = 0
        self.hash = hashlib.new(layer.digest.split(":", 1)[0]) if layer.digest else None

    def read(self, size: int = -1) -> bytes:
        want = CHUNK if size < 0 or size > CHUNK else size
        if self.layer.size is not None:
            want = min(want, self.layer.size + 1 - self.got)
        data = self.inner.read(want) if want > 0 else b""
        self.got += len(data)
        self.budget.charge(len(data))
        if self.layer.size is not None and self.got > self.layer.size:
            raise LimitExceeded(
                f"{self.layer.name}: layer larger than the {self.layer.size} bytes it declares"
            )
        if self.hash is not None:
            self.hash.update(data)
        return data

    def verify(self) -> None:
        size, name = self.layer.size, self.layer.name
        if size is not None and self.got != size:
            raise CorruptInput(f"{name}: layer of {self.got} bytes, {size} declared")
        if self.hash is None or self.layer.digest is None:
            return
        if self.hash.hexdigest() != self.layer.digest.split(":", 1)[1]:
            raise ScanInputError(f"{name}: layer content does not match its digest")
