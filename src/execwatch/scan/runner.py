"""image -> layers -> filesystem view -> checks -> results, for every kind of input."""

from __future__ import annotations

import os
import posixpath
import stat
import tarfile
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import zstandard

from execwatch.binfmt import Platform, node_platform
from execwatch.runnable.directory import DirectoryFS, looks_like_root
from execwatch.runnable.fs import FileSystem, describe_file
from execwatch.runnable.limits import Limits
from execwatch.runnable.linker import SymbolSource
from execwatch.runnable.memory import MemoryFS
from execwatch.scan.bounded import decompressed
from execwatch.scan.checks import Checker, Target
from execwatch.scan.errors import CorruptInput, LimitExceeded, NothingToCheck, ScanInputError
from execwatch.scan.layers import apply_layer
from execwatch.scan.model import ImageResult, ScanReport
from execwatch.scan.oci import images_in_store
from execwatch.scan.registry import RegistryOptions, looks_like_reference, registry_images
from execwatch.scan.sources import (
    ImageBudget,
    ImageSource,
    directory_store,
    is_archive,
    layer_stream,
    open_archive,
    survey_archive,
)

Progress = Callable[[str, int | None], Callable[[int], None]]


@dataclass
class ScanOptions:
    # --platform, repeatable: the platforms of an index to scan (default: all of them), and
    # the platforms a file or root filesystem is checked against, each (default: this node)
    platforms: tuple[Platform, ...] = ()
    require_static: bool = False
    cpu_levels: int | None = None  # --cpu-level (binfmt.isa bits)
    allow_empty: bool = False  # nothing executable in a target: a warning, not an error
    root: bool = False  # --root: a directory is a root filesystem even when it looks not
    limits: Limits = field(default_factory=Limits)
    registry: RegistryOptions = field(default_factory=RegistryOptions)


def scan(target: str, options: ScanOptions, progress: Progress | None = None) -> ScanReport:
    """Scan a file, a root filesystem directory, an OCI layout or an image/rootfs archive.

    Raises ScanInputError (one line) for input that cannot be scanned, including a target
    with nothing executable in it unless options.allow_empty.
    """
    with input_errors(target):
        report = _scan(target, options, progress)
    return require_executables(report, options)


def require_executables(report: ScanReport, options: ScanOptions) -> ScanReport:
    """A result with nothing executable in it: NothingToCheck, or a warning (allow_empty)."""
    for result in report.results:
        if result.stats.executables == 0 and not result.findings:
            message = f"nothing to check: no executable in {result.source}"
            if not options.allow_empty:
                raise NothingToCheck(f"{message} (--allow-empty to accept)")
            report.warnings.append(message)
    return report


@contextmanager
def input_errors(target: str) -> Iterator[None]:
    """Whatever a truncated or corrupt archive makes tarfile, gzip, zlib or zstd raise."""
    try:
        yield
    except (tarfile.TarError, EOFError, zlib.error, zstandard.ZstdError) as exc:
        detail = str(exc) or type(exc).__name__
        raise CorruptInput(f"{target}: truncated or corrupt archive: {detail}") from exc
    except OSError as exc:  # gzip.BadGzipFile, EIO, EACCES ...
        raise CorruptInput(f"{target}: unreadable: {exc.strerror or exc}") from exc


InputKind = Literal["reference", "layout", "directory", "archive", "file"]


def input_kind(target: str, what: str = "") -> InputKind:
    """What a command-line input is: a name that does not exist and reads as one is a
    registry reference. `what` prefixes errors (e.g. "--base ")."""
    if not os.path.lexists(target) and looks_like_reference(target):
        return "reference"
    try:
        st = os.stat(target)
    except OSError as exc:
        raise ScanInputError(f"{what}{target}: {exc.strerror}") from exc
    if stat.S_ISDIR(st.st_mode):
        return "layout" if os.path.exists(os.path.join(target, "oci-layout")) else "directory"
    if not stat.S_ISREG(st.st_mode):
        raise ScanInputError(f"{what}{target}: not a regular file or directory")
    return "archive" if is_archive(target) else "file"


def _scan(target: str, options: ScanOptions, progress: Progress | None) -> ScanReport:
    report = ScanReport(target)
    kind = input_kind(target)
    if kind == "reference":
        pulled = registry_images(target, options.registry, options.limits)
        report.results += _scan_images(pulled.images, options, progress)
        pulled.annotate(report.results)
    elif kind == "layout":
        images = images_in_store(directory_store(target), options.limits)
        report.results += _scan_images(images, options, progress)
    elif kind == "directory" and (options.root or looks_like_root(target)):
        report.results += _scan_rootfs(target, options, progress)
    elif kind == "directory":
        report.results += _scan_loose(target, options, progress)
    elif kind == "file":
        report.results += _scan_file(target, options)
    else:
        report.results += _scan_archive(target, options, progress)
    return report


def _scan_archive(
    target: str, options: ScanOptions, progress: Progress | None
) -> list[ImageResult]:
    survey = survey_archive(target, options.limits)
    if survey.kind == "rootfs":
        return _scan_rootfs_archive(target, options, progress)
    with ExitStack() as stack:
        store = open_archive(target, stack, options.limits, survey)
        return _scan_images(images_in_store(store, options.limits), options, progress)


def file_fs(path: str, options: ScanOptions) -> tuple[MemoryFS, str, int]:
    """A lone file as the only file of a tree: the tree, its path there, bytes read."""
    fs = MemoryFS(options.limits)
    name = "/" + os.path.basename(path)
    mode = stat.S_IMODE(os.stat(path).st_mode) | 0o100  # a lone file is checked as executable
    with open(path, "rb") as f:
        node = describe_file(name, f, os.fstat(f.fileno()).st_size, mode)
        bytes_read = f.tell()
    fs.put(name, node)
    return fs, name, bytes_read


def _scan_file(path: str, options: ScanOptions) -> list[ImageResult]:
    fs, _, bytes_read = file_fs(path, options)
    results = []
    for platform in options.platforms or (node_platform(),):
        checker = Checker(target_of(fs, platform, options, isolated=True))
        findings, stats = checker.run()
        stats.bytes_read = bytes_read
        findings = [f.__class__(**{**f.__dict__, "path": path}) for f in findings]
        note = "single file: loader and libraries not checked (no root filesystem)"
        results.append(ImageResult(path, str(platform), None, findings, stats, notes=[note]))
    return results


def _scan_rootfs(root: str, options: ScanOptions, progress: Progress | None) -> list[ImageResult]:
    fs = DirectoryFS(root)  # shared by the platforms: each file is read once
    results = []
    for platform in options.platforms or (node_platform(),):
        before = fs.bytes_read
        result = check(root, fs, target_of(fs, platform, options), progress)
        result.stats.bytes_read = fs.bytes_read - before
        if not options.platforms:
            result.notes.append(f"no --platform: checked against this node ({platform})")
        results.append(result)
    return results


def _scan_loose(
    directory: str, options: ScanOptions, progress: Progress | None
) -> list[ImageResult]:
    """A directory that is no root filesystem (a build's output): each file on its own."""
    fs = DirectoryFS(directory)
    results = []
    for platform in options.platforms or (node_platform(),):
        before = fs.bytes_read
        result = check(directory, fs, target_of(fs, platform, options, isolated=True), progress)
        result.stats.bytes_read = fs.bytes_read - before
        result.notes.append(LOOSE_NOTE)
        results.append(result)
    return results


LOOSE_NOTE = (
    "not a root filesystem (no loader, /bin, /usr or /etc): files checked one by one,"
    " loaders, libraries and #! interpreters not checked (--base IMAGE to check them"
    " against the image they will run on, --root to take the directory as a root)"
)


def rootfs_archive_fs(path: str, options: ScanOptions) -> tuple[MemoryFS, int]:
    """A rootfs tarball applied in memory, and the bytes read from it."""
    fs = MemoryFS(options.limits)
    counter = [0, 0]
    budget = ImageBudget.start(path, options.limits)
    with open(path, "rb") as f:
        stream = decompressed(f, path, options.limits, counter)
        apply_layer(fs, stream, path, options.limits, [0], budget=budget)
    return fs, counter[1]


def _scan_rootfs_archive(
    path: str, options: ScanOptions, progress: Progress | None
) -> list[ImageResult]:
    fs, bytes_read = rootfs_archive_fs(path, options)
    results: list[ImageResult] = []
    for platform in options.platforms or (node_platform(),):
        result = check(path, fs, target_of(fs, platform, options), progress)
        result.stats.bytes_read = bytes_read if not results else 0  # read once, for the first
        results.append(result)
    return results


def _scan_images(
    images: list[ImageSource], options: ScanOptions, progress: Progress | None
) -> list[ImageResult]:
    """Every image, or those of the requested platforms: an image that states no platform
    is checked against each of them. A requested platform the input lacks is an error,
    before anything is scanned."""
    chosen = choose_images(images, options)
    return [scan_image(image, options, want, progress) for image, want in chosen]


def choose_images(
    images: list[ImageSource], options: ScanOptions
) -> list[tuple[ImageSource, Platform | None]]:
    """The images of options.platforms (all without), each with the platform asked for."""
    if not images:
        raise ScanInputError("no image manifests found")
    if not options.platforms:
        return [(image, None) for image in images]
    stated = [(image, image.platform or image.config_platform()) for image in images]
    chosen: dict[tuple[int, str], tuple[ImageSource, Platform]] = {}
    lacking = []
    for want in options.platforms:
        matching = [(image, p or want) for image, p in stated if (p or want).matches(want)]
        lacking += [] if matching else [str(want)]
        for image, platform in matching:
            chosen.setdefault((id(image), str(platform)), (image, want))
    if lacking:
        have = ", ".join(sorted({str(p) for _, p in stated}))
        raise ScanInputError(f"no {' and no '.join(lacking)} image (the input has: {have})")
    return list(chosen.values())


def scan_image(
    image: ImageSource,
    options: ScanOptions,
    want: Platform | None = None,
    progress: Progress | None = None,
) -> ImageResult:
    """One image, against the platform it states, else `want`, else this node's: the
    verdict audit and placement ask for (run it in scan.isolated's child process)."""
    started = time.perf_counter()
    fs, bytes_read = image_fs(image, options, progress)
    config_platform = image.config_platform()
    platform = image.platform or config_platform or want or node_platform()
    cfg = image_config(image)
    target = target_of(
        fs,
        platform,
        options,
        env=image_env(cfg.get("Env")),
        entrypoint=_argv(cfg),
        workdir=posixpath.join("/", str(cfg.get("WorkingDir") or "/")),
        config_platform=config_platform,
    )
    result = check(image.label, fs, target, progress)
    result.digest = image.digest
    result.stats.bytes_read = bytes_read
    result.stats.seconds = time.perf_counter() - started
    return result


def image_config(image: ImageSource) -> dict[str, Any]:
    """The image config's `config` object (Env, Entrypoint, Cmd, WorkingDir)."""
    cfg = image.config.get("config")
    return cfg if isinstance(cfg, dict) else {}


def image_fs(
    image: ImageSource, options: ScanOptions, progress: Progress | None = None
) -> tuple[MemoryFS, int]:
    """An image's layers applied in memory, within its budget, and the bytes read."""
    fs = MemoryFS(options.limits)
    counter, entries = [0, 0], [0]
    budget = ImageBudget.start(image.label, options.limits)
    declared = sum(layer.size or 0 for layer in image.layers)
    if declared > budget.max_bytes:
        raise LimitExceeded(
            f"{image.label}: more than {budget.max_bytes} bytes read: its layers declare {declared}"
        )
    for i, layer in enumerate(image.layers):
        if progress is not None:
            progress(f"layer {i + 1}/{len(image.layers)}", None)(0)
        with layer_stream(layer, options.limits, counter, budget) as stream:
            apply_layer(fs, stream, layer.name, options.limits, entries,
                        require_end=layer.digest is None, budget=budget)  # fmt: skip
    return fs, counter[1]


def target_of(fs: FileSystem, platform: Platform, options: ScanOptions, **how: Any) -> Target:
    return Target(
        fs,
        platform,
        require_static=options.require_static,
        cpu_levels=options.cpu_levels,
        **how,
    )


def check(label: str, fs: FileSystem, target: Target, progress: Progress | None) -> ImageResult:
    tick = progress(label, None) if progress is not None else None
    findings, stats = Checker(target).run(tick)
    findings.sort(key=lambda f: (not f.entrypoint, -f.severity, f.check, f.path))
    result = ImageResult(label, str(target.platform), target.entrypoint, findings, stats)
    if not isinstance(fs, SymbolSource):
        result.notes.append(
            "missing-symbol not checked: symbols are read from a root on disk"
            " (execwatch scan DIR), not kept from image layers"
        )
    return result


def _argv(cfg: dict[str, object]) -> list[str] | None:
    entrypoint, cmd = cfg.get("Entrypoint"), cfg.get("Cmd")
    argv: list[str] = []
    if isinstance(entrypoint, list):
        argv += [str(a) for a in entrypoint]
    if isinstance(cmd, list):
        argv += [str(a) for a in cmd]
    return argv or None


def image_env(raw: object) -> dict[str, str]:
    env = {}
    if isinstance(raw, list):
        for item in raw:
            if isinstance(item, str) and "=" in item:
                key, value = item.split("=", 1)
                env[key] = value
    return env
