"""Streams and JSON bounded against hostile input: what a scan reads and decompresses."""

from __future__ import annotations

import gzip
import json
from typing import Any, Protocol

import zstandard

from execwatch.runnable.errors import CorruptInput, LimitExceeded
from execwatch.runnable.limits import Limits

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
CHUNK = 1 << 20


class Readable(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...


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
