"""Bounds on what hostile input can make a scan read, decompress or keep in memory."""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from typing import Any, Protocol

import zstandard

from execwatch.scan.errors import CorruptInput, LimitExceeded

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
CHUNK = 1 << 20


class Readable(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...


@dataclass(frozen=True)
class Limits:
    """Defaults fit real images with a wide margin; tests shrink them to prove the bounds."""

    max_uncompressed_bytes: int = 64 << 30  # all layers of one image, after decompression
    max_ratio: int = 1000  # uncompressed / compressed, checked once past ratio_floor
    ratio_floor: int = 256 << 20
    max_entries: int = 2_000_000  # tar members over all layers
    max_tar_header_bytes: int = 1 << 20  # pax and GNU long-name headers are read into memory
    max_text_bytes: int = 16 << 20  # loader configuration text kept in memory (fs.wants_text)
    max_link_target_bytes: int = 4095  # symlink targets: a page, as Linux file systems store them
    max_json_bytes: int = 4 << 20  # manifests, indexes, configs (containerd's manifest limit)
    max_json_tokens: int = 100_000  # `{ [ , :` in one document: bounds the objects json builds
    max_index_depth: int = 8
    max_manifests: int = 512
    max_layers: int = 1024
    max_archive_members: int = 100_000  # members of an image archive (blobs, not files)
    # One image, all of its layers (scan.sources.Budget): bytes read from its source, and
    # wall time. 16 GiB compressed is 4x the largest public images (CUDA, ML stacks).
    max_image_bytes: int = 16 << 30
    max_image_seconds: float = 1800.0
    # Its merged tree (scan.fs.MemoryFS): PATH_MAX / 2 components is the deepest path one
    # syscall names; a large distribution image has a few hundred thousand entries.
    max_tree_depth: int = 2048
    max_tree_nodes: int = 2_000_000
    max_tree_path_bytes: int = 256 << 20  # the entries' paths, which the tree keeps
    # The linker, per executable resolved (scan.linker.Work): a real program needs a few
    # hundred lookups (100 libraries x 20 directories is 2,000), all well under a second.
    max_linker_probes: int = 1 << 15  # candidate paths looked up: names x directories
    max_linker_steps: int = 1 << 18  # loop iterations: names, path entries, config lines
    max_linker_bytes: int = 16 << 20  # path and configuration text built or read
    max_linker_seconds: float = 5.0
    max_search_dirs: int = 8192  # distinct directories, all sources together
    max_ld_library_path_bytes: int = 128 << 10  # MAX_ARG_STRLEN: exec refuses a longer one
    max_ld_library_path_entries: int = 1024


class BoundedStream:
    """A read-only stream that counts what passes and fails once a limit is crossed.

    `counter` is shared by the layers of one image: [uncompressed, compressed] bytes.
    """

    def __init__(self, inner: Readable, name: str, limits: Limits, counter: list[int]) -> None:
        self.inner = inner
        self.name = name
        self.limits = limits
        self.counter = counter

    def read(self, size: int = -1) -> bytes:
        data = self.inner.read(size if 0 <= size <= CHUNK else CHUNK)
        self.counter[0] += len(data)
        total, packed = self.counter
        if total > self.limits.max_uncompressed_bytes:
            raise LimitExceeded(
                f"{self.name}: more than {self.limits.max_uncompressed_bytes} bytes"
                " uncompressed (decompression bomb?)"
            )
        if total > self.limits.ratio_floor and total > packed * self.limits.max_ratio:
            raise LimitExceeded(
                f"{self.name}: expands more than {self.limits.max_ratio}x (decompression bomb?)"
            )
        return data


class Tally:
    """Counts the bytes a reader (tarfile) actually got from a stream."""

    def __init__(self, inner: Readable) -> None:
        self.inner = inner
        self.bytes = 0

    def read(self, size: int = -1) -> bytes:
        data = self.inner.read(size)
        self.bytes += len(data)
        return data


def check_tar_end(end_offset: int, tally: Tally, name: str) -> None:
    """A streamed tar that stops without its end-of-archive block was cut short.

    tarfile's stream mode takes a short read, inside member data or at a header, for the
    end of the archive; every tar writer ends an archive with zero blocks after the last
    member, so fewer bytes than that means truncation.
    """
    if tally.bytes < end_offset + 512:
        raise CorruptInput(f"{name}: truncated or corrupt archive: it ends inside a member")


def parse_json(raw: bytes, what: str, limits: Limits) -> Any:
    """json.loads, bounded: in bytes, in tokens (each builds an object) and in nesting."""
    if len(raw) > limits.max_json_bytes:
        raise LimitExceeded(f"{what} is larger than {limits.max_json_bytes} bytes")
    tokens = sum(raw.count(c) for c in (b"{", b"[", b",", b":"))
    if tokens > limits.max_json_tokens:
        raise LimitExceeded(f"{what} has more than {limits.max_json_tokens} JSON values")
    try:
        return json.loads(raw)
    except RecursionError as exc:
        raise LimitExceeded(f"{what} is nested too deeply") from exc
    except ValueError as exc:
        raise CorruptInput(f"{what} is not valid JSON") from exc


class CountingReader:
    """Counts the compressed bytes read from a blob."""

    def __init__(self, inner: Readable, counter: list[int]) -> None:
        self.inner = inner
        self.counter = counter

    def read(self, size: int = -1) -> bytes:
        data = self.inner.read(size if 0 <= size <= CHUNK else CHUNK)
        self.counter[1] += len(data)
        return data


def decompressed(raw: Readable, name: str, limits: Limits, counter: list[int]) -> BoundedStream:
    """Sniff gzip / zstd / plain from the first bytes (media types are often wrong) and wrap."""
    counted = CountingReader(raw, counter)
    magic = counted.read(4)
    head = _Prefixed(magic, counted)
    inner: Readable
    if magic.startswith(GZIP_MAGIC):
        inner = gzip.GzipFile(fileobj=head, mode="rb")  # type: ignore[call-overload]
    elif magic == ZSTD_MAGIC:
        inner = zstandard.ZstdDecompressor().stream_reader(
            head,  # type: ignore[arg-type]  # any object with read() will do
            read_across_frames=True,
        )
    else:
        inner = head
    return BoundedStream(inner, name, limits, counter)


class _Prefixed:
    """Give back bytes already read for sniffing, then continue with the stream."""

    def __init__(self, prefix: bytes, inner: Readable) -> None:
        self.prefix = prefix
        self.inner = inner

    def read(self, size: int = -1) -> bytes:
        if self.prefix:
            if size < 0:
                out, self.prefix = self.prefix + self.inner.read(CHUNK), b""
                return out
            out, self.prefix = self.prefix[:size], self.prefix[size:]
            return out
        return self.inner.read(size if 0 <= size <= CHUNK else CHUNK)
