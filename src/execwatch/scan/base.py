"""`execwatch scan FILES --base IMAGE [--at PATH]`: a build's files before the image exists.

The files (one file, or a directory's tree) are placed at PATH over the base's root
(runnable.fs.Placed), as the build's COPY will place them, and checked there with the
base's Env: loaders, libraries, `#!` interpreters and PATH are the base's, not the build
host's. The base is any input scan reads: an image (layout, archive, reference, one per
platform), a root filesystem directory or a rootfs tarball.
"""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field

from execwatch.binfmt import Platform, node_platform
from execwatch.runnable.directory import DirectoryFS
from execwatch.runnable.fs import FileSystem, Placed, normalise
from execwatch.scan.errors import ScanInputError
from execwatch.scan.model import ImageResult, ScanReport
from execwatch.scan.oci import images_in_store
from execwatch.scan.registry import registry_images
from execwatch.scan.runner import (
    Progress,
    ScanOptions,
    check,
    choose_images,
    file_fs,
    image_config,
    image_env,
    image_fs,
    input_errors,
    input_kind,
    require_executables,
    rootfs_archive_fs,
    target_of,
)
from execwatch.scan.sources import (
    ImageSource,
    Layer,
    directory_store,
    open_archive,
    survey_archive,
)

DEFAULT_AT = "/app"


@dataclass
class BaseRoot:
    """One root the build's files will run on: an image's platform, or a root filesystem."""

    label: str
    fs: FileSystem
    platform: Platform
    env: dict[str, str] = field(default_factory=dict)


def scan_on_base(
    target: str, base: str, at: str, options: ScanOptions, progress: Progress | None = None
) -> ScanReport:
    """Check `target`'s files placed at `at` over each root of `base`."""
    if not at.startswith("/"):
        raise ScanInputError(f"--at {at}: not an absolute path")
    at = normalise(at)
    report = ScanReport(target)
    with input_errors(target):
        build, entry = _build(target, options)
    with input_errors(base), base_roots(base, options, progress) as roots:
        for root in roots:
            report.results.append(_check_on(target, build, entry, at, root, options, progress))
    return require_executables(report, options)


def _check_on(
    target: str,
    build: FileSystem,
    entry: str | None,
    at: str,
    root: BaseRoot,
    options: ScanOptions,
    progress: Progress | None,
) -> ImageResult:
    fs = Placed(root.fs, build, at)
    entrypoint = [normalise(at + entry)] if entry else None
    how = target_of(fs, root.platform, options, env=root.env, entrypoint=entrypoint)
    result = check(f"{target} on {root.label}", fs, how, progress)
    result.notes.append(f"{target} placed at {at} over {root.label}")
    return result


def _build(target: str, options: ScanOptions) -> tuple[FileSystem, str | None]:
    """The files to place, and the one file's path in them when the target is a file."""
    kind = input_kind(target)
    if kind == "directory":
        return DirectoryFS(target), None
    if kind != "file":
        raise ScanInputError(f"{target}: --base places a build's file or directory, not an image")
    fs, name, _ = file_fs(target, options)
    return fs, name


@contextmanager
def base_roots(
    base: str, options: ScanOptions, progress: Progress | None = None
) -> Iterator[list[BaseRoot]]:
    """Each root of `base`: an image's (of options.platforms), or a root filesystem's for
    each of options.platforms (default: this node's)."""
    with base_images(base, options) as images:
        if images is not None:
            yield _image_roots(images, options, progress)
        elif os.path.isdir(base):
            yield _fs_roots(base, DirectoryFS(base), options)
        else:
            yield _fs_roots(base, rootfs_archive_fs(base, options)[0], options)


@contextmanager
def base_images(base: str, options: ScanOptions) -> Iterator[list[ImageSource] | None]:
    """The images of `base`; None when it is a root filesystem (a directory or tarball)."""
    kind = input_kind(base, "--base ")
    if kind == "reference":
        yield registry_images(base, options.registry, options.limits).images
    elif kind == "layout":
        yield images_in_store(directory_store(base), options.limits)
    elif kind == "directory":
        yield None
    elif kind == "file":
        raise ScanInputError(f"--base {base}: not an image, a root filesystem or an archive")
    elif (survey := survey_archive(base, options.limits)).kind == "rootfs":
        yield None
    else:
        with ExitStack() as stack:
            store = open_archive(base, stack, options.limits, survey)
            yield images_in_store(store, options.limits)


@contextmanager
def placed_images(
    target: str, base: str, at: str, options: ScanOptions
) -> Iterator[list[ImageSource]]:
    """--run: each image of `base` (of options.platforms) with the one program `target`
    added at `at` as a last layer and as its Entrypoint: the image the build would make,
    labelled as its static result is."""
    if input_kind(target) != "file":
        raise ScanInputError(f"--run with --base: {target}: give the one program to start")
    entry = normalise(f"{normalise(at)}/{os.path.basename(target)}")
    layer = _file_layer(target, entry)
    with base_images(base, options) as images:
        if images is None:
            raise ScanInputError(f"--run with --base {base}: needs an image to run in")
        yield [_placed(target, image, layer, entry) for image, _ in choose_images(images, options)]


def _file_layer(path: str, entry: str) -> Layer:
    """A one-file layer, in memory: `path` at `entry`, executable."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar, open(path, "rb") as f:
        info = tar.gettarinfo(fileobj=f, arcname=entry.lstrip("/"))
        info.mode = (info.mode & 0o777) | 0o100
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        tar.addfile(info, f)
    raw = data.getvalue()
    return Layer(path, None, None, lambda: io.BytesIO(raw), len(raw))


def _placed(target: str, image: ImageSource, layer: Layer, entry: str) -> ImageSource:
    cfg = {**image_config(image), "Entrypoint": [entry], "Cmd": None}
    config = {**image.config, "config": cfg}
    label = f"{target} on {image.label}"
    return ImageSource(label, image.platform, config, [*image.layers, layer])


def _fs_roots(label: str, fs: FileSystem, options: ScanOptions) -> list[BaseRoot]:
    return [BaseRoot(label, fs, p) for p in options.platforms or (node_platform(),)]


def _image_roots(
    images: list[ImageSource], options: ScanOptions, progress: Progress | None
) -> list[BaseRoot]:
    roots = []
    for image, want in choose_images(images, options):
        fs, _ = image_fs(image, options, progress)
        platform = image.platform or image.config_platform() or want or node_platform()
        env = image_env(image_config(image).get("Env"))
        roots.append(BaseRoot(image.label, fs, platform, env))
    return roots
