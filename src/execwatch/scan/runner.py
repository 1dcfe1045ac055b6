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
from typing import Any

import zstandard

from execwatch.binfmt import Platform, node_platform
from execwatch.runnable.directory import DirectoryFS
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
    limits: Limits = field(default_factory=Limits)
    registry: RegistryOptions = field(default_factory=RegistryOptions)


def scan(target: str, options: ScanOptions, progress: Progress | None = None) -> ScanReport:
    """Scan a file, a root filesystem directory, an OCI layout or an image/rootfs archive.

    Raises ScanInputError (one line) for input that cannot be scanned, including a target
    with nothing executable in it unless options.allow_empty.
    """
    with _input_errors(target):
        report = _scan(target, options, progress)
    for result in report.results:
        if result.stats.executables == 0 and not result.findings:
            message = f"nothing to check: no executable in {result.source}"
            if not options.allow_empty:
                raise NothingToCheck(f"{message} (--allow-empty to accept)")
            report.warnings.append(message)
    return report


@contextmanager
def _input_errors(target: str) -> Iterator[None]:
    """Whatever a truncated or corrupt archive makes tarfile, gzip, zlib or zstd raise."""
    try:
        yield
    except (tarfile.TarError, EOFError, zlib.error, zstandard.ZstdError) as exc:
        detail = str(exc) or type(exc).__name__
        raise CorruptInput(f"{target}: truncated or corrupt archive: {detail}") from exc
    except OSError as exc:  # gzip.BadGzipFile, EIO, EACCES ...
        raise CorruptInput(f"{target}: unreadable: {exc.strerror or exc}") from exc


def _scan(target: str, options: ScanOptions, progress: Progress | None) -> ScanReport:
    report = ScanReport(target)
    if not os.path.lexists(target) and looks_like_reference(target):
        pulled = registry_images(target, options.registry, options.limits)
        report.results += _scan_images(pulled.images, options, progress)
        pulled.annotate(report.results)
        return report
    try:
        st = os.stat(target)
    except OSError as exc:
        raise ScanInputError(f"{target}: {exc.strerror}") from exc
    if stat.S_ISDIR(st.st_mode):
        if os.path.exists(os.path.join(target, "oci-layout")):
            store = directory_store(target)
            report.results += _scan_images(
                images_in_store(store, options.limits), options, progress
            )
        else:
            report.results += _scan_rootfs(target, options, progress)
        return report
    if not stat.S_ISREG(st.st_mode):
        raise ScanInputError(f"{target}: not a regular file or directory")
    if is_archive(target):
        survey = survey_archive(target, options.limits)
        if survey.kind == "rootfs":
            report.results += _scan_rootfs_archive(target, options, progress)
            return report
        with ExitStack() as stack:
            store = open_archive(target, stack, options.limits, survey)
            report.results += _scan_images(
                images_in_store(store, options.limits), options, progress
            )
        return report
    report.results += _scan_file(target, options)
    return report


def _scan_file(path: str, options: ScanOptions) -> list[ImageResult]:
    fs = MemoryFS(options.limits)
    name = "/" + os.path.basename(path)
    mode = stat.S_IMODE(os.stat(path).st_mode) | 0o100  # a lone file is checked as executable
    with open(path, "rb") as f:
        node = describe_file(name, f, os.fstat(f.fileno()).st_size, mode)
        bytes_read = f.tell()
    fs.put(name, node)
    results = []
    for platform in options.platforms or (node_platform(),):
        checker = Checker(_target(fs, platform, options, isolated=True))
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
        result = _check(root, fs, _target(fs, platform, options), progress)
        result.stats.bytes_read = fs.bytes_read - before
        if not options.platforms:
            result.notes.append(f"no --platform: checked against this node ({platform})")
        results.append(result)
    return results


def _scan_rootfs_archive(
    path: str, options: ScanOptions, progress: Progress | None
) -> list[ImageResult]:
    fs = MemoryFS(options.limits)
    counter = [0, 0]
    budget = ImageBudget.start(path, options.limits)
    with open(path, "rb") as f:
        stream = decompressed(f, path, options.limits, counter)
        apply_layer(fs, stream, path, options.limits, [0], budget=budget)
    results: list[ImageResult] = []
    for platform in options.platforms or (node_platform(),):
        result = _check(path, fs, _target(fs, platform, options), progress)
        result.stats.bytes_read = counter[1] if not results else 0  # read once, for the first
        results.append(result)
    return results


def _scan_images(
    images: list[ImageSource], options: ScanOptions, progress: Progress | None
) -> list[ImageResult]:
    """Every image, or those of the requested platforms: an image that states no platform
    is checked against each of them. A requested platform the input lacks is an error,
    before anything is scanned."""
    if not images:
        raise ScanInputError("no image manifests found")
    if not options.platforms:
        return [scan_image(image, options, progress=progress) for image in images]
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
    return [scan_image(image, options, want, progress) for image, want in chosen.values()]


def scan_image(
    image: ImageSource,
    options: ScanOptions,
    want: Platform | None = None,
    progress: Progress | None = None,
) -> ImageResult:
    """One image, against the platform it states, else `want`, else this node's: the
    verdict audit and placement ask for (run it in scan.isolated's child process)."""
    started = time.perf_counter()
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
    config_platform = image.config_platform()
    platform = image.platform or config_platform or want or node_platform()
    cfg = image.config.get("config") if isinstance(image.config.get("config"), dict) else {}
    assert isinstance(cfg, dict)
    entrypoint = _argv(cfg)
    target = _target(
        fs,
        platform,
        options,
        env=image_env(cfg.get("Env")),
        entrypoint=entrypoint,
        workdir=posixpath.join("/", str(cfg.get("WorkingDir") or "/")),
        config_platform=config_platform,
    )
    result = _check(image.label, fs, target, progress)
    result.digest = image.digest
    result.stats.bytes_read = counter[1]
    result.stats.seconds = time.perf_counter() - started
    return result


def _target(fs: FileSystem, platform: Platform, options: ScanOptions, **how: Any) -> Target:
    return Target(
        fs,
        platform,
        require_static=options.require_static,
        cpu_levels=options.cpu_levels,
        **how,
    )


def _check(label: str, fs: FileSystem, target: Target, progress: Progress | None) -> ImageResult:
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
