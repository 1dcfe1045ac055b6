"""Apply OCI/Docker layer tarballs to a MemoryFS, following image-spec `layer.md`.

Nothing from the tar is written to the host: file nodes keep their first bytes and parsed
ELF headers only. ELF members are spooled (memory, then an anonymous temporary file) just
long enough to parse their headers, because the dynamic section can sit anywhere in a file.
"""

from __future__ import annotations

import posixpath
import tarfile
import tempfile
import zlib
from dataclasses import replace
from typing import Self

import zstandard

from execwatch.binfmt import sniff
from execwatch.binfmt.foreign import identify_stream
from execwatch.runnable.fs import HEAD_BYTES, Node, describe_file, wants_text
from execwatch.runnable.limits import Limits
from execwatch.runnable.memory import MemoryFS
from execwatch.scan.bounded import Readable, Tally, check_tar_end
from execwatch.scan.errors import CorruptInput, LimitExceeded, ScanInputError
from execwatch.scan.sources import ImageBudget

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
SPOOL_IN_MEMORY = 32 << 20


_EXTENSION_HEADERS = (
    tarfile.GNUTYPE_LONGNAME,
    tarfile.GNUTYPE_LONGLINK,
    tarfile.XHDTYPE,
    tarfile.XGLTYPE,
    tarfile.SOLARIS_XHDTYPE,
)


class _BoundedTarInfo(tarfile.TarInfo):
    """Refuse pax and GNU long-name headers, which tarfile reads into memory whole, when huge."""

    max_header_bytes = Limits().max_tar_header_bytes

    @classmethod
    def frombuf(cls, buf: bytes | bytearray, encoding: str, errors: str) -> Self:
        """The header block, refused before tarfile reads the extension it announces."""
        info = super().frombuf(buf, encoding, errors)
        if info.type in _EXTENSION_HEADERS and info.size > cls.max_header_bytes:
            raise _HeaderTooBig(f"{info.size}-byte tar extension header")
        return info


class _HeaderTooBig(tarfile.HeaderError):
    pass


def bounded_tarinfo(limits: Limits) -> type[tarfile.TarInfo]:
    """A TarInfo class that refuses extension headers over limits.max_tar_header_bytes
    (raising a tarfile.HeaderError)."""
    return type("_TarInfo", (_BoundedTarInfo,), {"max_header_bytes": limits.max_tar_header_bytes})


def member_path(name: str, layer: str) -> str | None:
    """The image path of a tar member; None for the root itself. Refuses escapes."""
    if name.startswith("/"):
        raise ScanInputError(f"{layer}: absolute path in layer: {name!r}")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ScanInputError(f"{layer}: path climbs out of the image: {name!r}")
    return "/" + "/".join(parts) if parts else None


def apply_layer(
    fs: MemoryFS,
    stream: Readable,
    layer: str,
    limits: Limits,
    entries: list[int],
    require_end: bool = True,
    budget: ImageBudget | None = None,
) -> None:
    """Apply one layer. `entries` counts tar members over all layers of the image.

    require_end: a tar cut short is an error (check_tar_end). A layer with a digest needs
    no such check: its digest already proves it whole, and accepting a writer that omits
    the end-of-archive blocks costs nothing there. budget: the image's deadline, checked
    at every member.
    """
    added: set[str] = set()
    opaque: set[str] = set()
    tarinfo = bounded_tarinfo(limits)
    tally = Tally(stream)
    try:
        tar = tarfile.open(fileobj=tally, mode="r|", tarinfo=tarinfo)  # type: ignore[call-overload]  # noqa: SIM115
        with tar:
            for member in tar:
                entries[0] += 1
                if entries[0] > limits.max_entries:
                    raise LimitExceeded(f"{layer}: more than {limits.max_entries} tar entries")
                if len(member.linkname) > limits.max_link_target_bytes:
                    raise LimitExceeded(
                        f"{layer}: link {member.name!r} has a target longer than"
                        f" {limits.max_link_target_bytes} bytes"
                    )
                if budget is not None:
                    budget.charge()
                _apply_member(fs, tar, member, layer, (added, opaque), limits)
            if require_end:
                check_tar_end(tar.offset, tally, layer)
    except _HeaderTooBig as exc:
        raise LimitExceeded(f"{layer}: corrupt layer: {exc}") from exc
    except (tarfile.TarError, EOFError, zlib.error, zstandard.ZstdError) as exc:
        raise CorruptInput(f"{layer}: corrupt layer: {exc or type(exc).__name__}") from exc
    except OSError as exc:  # gzip.BadGzipFile and friends
        raise CorruptInput(f"{layer}: unreadable layer: {exc}") from exc


def _apply_member(
    fs: MemoryFS,
    tar: tarfile.TarFile,
    member: tarfile.TarInfo,
    layer: str,
    seen: tuple[set[str], set[str]],
    limits: Limits,
) -> None:
    path = member_path(member.name, layer)
    if path is None:
        return
    added, opaque = seen
    parent, base = posixpath.split(path)
    if base == OPAQUE:
        _opaque(fs, parent, added, opaque)
        return
    if base.startswith(WHITEOUT):
        fs.remove(posixpath.join(parent, base[len(WHITEOUT) :]))
        return
    mode = member.mode & 0o7777
    if member.isdir():
        existing = fs.node(path)
        if existing is not None and existing.kind == "dir":
            existing.mode = mode
        else:
            fs.put(path, Node("dir", mode))
    elif member.issym():  # kept as is: resolve() clamps ".." at the image root, like a chroot
        fs.put(path, Node("symlink", 0o777, target=member.linkname))
    elif member.islnk():
        link = member_path(member.linkname, layer)
        target = fs.node(link) if link else None
        if target is None or target.kind != "file":
            raise ScanInputError(f"{layer}: hardlink {path} -> {member.linkname}: no such file")
        fs.put(path, replace(target))
    elif member.isreg():
        node = _file_node(tar, member, path)
        fs.text_bytes += len(node.text or b"")
        if fs.text_bytes > limits.max_text_bytes:
            raise LimitExceeded(f"{layer}: more than {limits.max_text_bytes} bytes of *.conf")
        fs.put(path, node)
    else:
        fs.put(path, Node("other", mode))
    _mark_added(path, added)


def _mark_added(path: str, added: set[str]) -> None:
    while path not in added and path != "/":
        added.add(path)
        path = posixpath.dirname(path)


def _opaque(fs: MemoryFS, directory: str, added: set[str], done: set[str]) -> None:
    """Hide the lower children of `directory`, keeping what this layer already put there.

    A loop over the directory's subtree that stops at directories already made opaque in
    this layer (`done`): everything under those is this layer's, so however the markers are
    ordered and nested, each entry is visited once per layer.
    """
    ancestor = directory
    while ancestor not in done:
        if ancestor == "/":
            break
        ancestor = posixpath.dirname(ancestor)
    if ancestor in done:
        return
    stack = [directory]
    while stack:
        current = stack.pop()
        for child in fs.listdir(current):
            path = posixpath.join(current, child)
            node = fs.node(path)
            if path not in added:
                fs.remove(path)
            elif node is not None and node.kind == "dir" and path not in done:
                stack.append(path)
    done.add(directory)
    _mark_added(directory, added)


def _file_node(tar: tarfile.TarFile, member: tarfile.TarInfo, path: str) -> Node:
    data = tar.extractfile(member)
    assert data is not None
    mode = member.mode & 0o7777
    head = data.read(HEAD_BYTES)
    if sniff(head) != "elf":
        node = Node("file", mode, member.size, head=head)
        if wants_text(path, member.size):
            node.text = head + data.read(member.size)
        elif mode & 0o111:
            node.foreign = identify_stream(head, data)
        return node
    with tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY) as spool:
        spool.write(head)
        while chunk := data.read(1 << 20):
            spool.write(chunk)
        spool.seek(0)
        return describe_file(path, spool, member.size, mode)  # type: ignore[arg-type]
