"""`execwatch scan IMAGE --run`: unpack each platform's image, start its entrypoint in the
sandbox, and put the outcome into the scan's report as findings with `source: run`."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field

from execwatch.binfmt import Platform, node_platform
from execwatch.runnable.limits import Limits
from execwatch.scan.errors import ScanInputError
from execwatch.scan.isolated import ProcessLimits, run_isolated
from execwatch.scan.model import Finding, ImageResult, ScanReport, Severity
from execwatch.scan.oci import images_in_store
from execwatch.scan.registry import RegistryOptions, looks_like_reference, registry_images
from execwatch.scan.runner import image_env
from execwatch.scan.sources import (
    ImageSource,
    directory_store,
    is_archive,
    open_archive,
    survey_archive,
)
from execwatch.scan.vocabulary import CHECK_OF_REASON, Check
from execwatch.smoke import namespaces
from execwatch.smoke.classify import RunVerdict, classify
from execwatch.smoke.namespaces import Launch, ProcessEnd, QemuSetup, RunLimits
from execwatch.smoke.unpack import TMPFS_BYTES, Unpacked, remove_tree, unpack_root

DROP_UID = DROP_GID = 65534  # a root caller runs the image as nobody, mapped to the image's user
GiB = 1 << 30
# Debian qemu-user-static's binfmt entries (magic, mask), by OCI architecture
QEMU: dict[str, tuple[str, bytes, bytes, int]] = {
    "arm64": (
        "qemu-aarch64",
        b"\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00",
        b"\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff",
        183,
    ),
}
NATIVE = {"amd64": "x86_64", "arm64": "aarch64"}


class RunSetupError(ScanInputError):
    """A run that could not be set up: one line, exit 2."""


@dataclass(frozen=True)
class RunOptions:
    args: tuple[str, ...] | None = None  # --run-args: replaces Cmd
    timeout_fails: bool = False
    qemu_dir: str | None = None
    binfmt: bool = True  # False: QEMU is always invoked directly (EXECWATCH_RUN_QEMU=direct)
    limits: RunLimits = field(default_factory=RunLimits)
    max_unpack: int = 8 * GiB
    tmpfs_bytes: int = TMPFS_BYTES  # an image this small unpacks on a tmpfs (0: never)


@dataclass
class RunResult:
    platform: str
    argv: list[str]
    outcome: ProcessEnd
    verdict: RunVerdict
    unpacked: Unpacked


def run_report(
    target: str, static: Callable[[], ScanReport], platforms: tuple[Platform, ...],
    options: RunOptions, registry: RegistryOptions, limits: Limits,
) -> ScanReport:  # fmt: skip
    """Run every image of `target` (of `platforms`, when given): the static scan's report
    (`static()`, awaited after the runs) with the findings added to the same image's result."""
    with _images(target, registry, limits) as images:
        return run_images(images, static, platforms, options, limits)


def run_images(
    images: list[ImageSource], static: Callable[[], ScanReport],
    platforms: tuple[Platform, ...], options: RunOptions, limits: Limits,
) -> ScanReport:  # fmt: skip
    """Run each image (of `platforms`, when given) while the static scan may still be under
    way; then its report (`static()`), each finding joined to its result of the same label
    and platform, where the disagreement with the static verdict is named."""
    problem = namespaces.refusal()
    if problem:
        raise RunSetupError(problem)
    done: list[tuple[ImageSource, Platform, RunResult]] = []
    for image in images:
        platform = image.platform or image.config_platform() or node_platform()
        if platforms and not any(platform.matches(p) for p in platforms):
            continue
        done.append((image, platform, run_image(image, platform, options, limits)))
    report = static()
    for image, platform, run in done:
        result = _result_for(report, image, platform)
        result.findings.append(_finding(run, result))
    return report


@contextmanager
def _images(target: str, registry: RegistryOptions, limits: Limits) -> Iterator[list[ImageSource]]:
    if not os.path.lexists(target) and looks_like_reference(target):
        yield registry_images(target, registry, limits).images
        return
    if os.path.isdir(target) and os.path.exists(os.path.join(target, "oci-layout")):
        yield images_in_store(directory_store(target), limits)
        return
    if os.path.isfile(target) and is_archive(target):
        survey = survey_archive(target, limits)
        if survey.kind != "rootfs":
            with ExitStack() as stack:
                yield images_in_store(open_archive(target, stack, limits, survey), limits)
            return
    raise RunSetupError(f"{target}: --run needs an image (OCI layout, image archive or reference)")


def _result_for(report: ScanReport, image: ImageSource, platform: Platform) -> ImageResult:
    for result in report.results:
        if result.source == image.label and result.platform == str(platform):
            return result
    result = ImageResult(image.label, str(platform), digest=image.digest)
    report.results.append(result)
    return result


def run_image(
    image: ImageSource, platform: Platform, options: RunOptions, limits: Limits
) -> RunResult:
    cfg = image.config.get("config")
    cfg = cfg if isinstance(cfg, dict) else {}
    argv = _argv(cfg, options.args)
    if not argv:
        raise RunSetupError(f"{image.label}: no Entrypoint or Cmd to run (give --run-args)")
    emulator, machines = _emulation(platform, options)
    work = tempfile.mkdtemp(prefix="execwatch-run-")
    try:
        os.chmod(work, 0o755)
        lower, stage = os.path.join(work, "root"), os.path.join(work, "stage")
        for d in (lower, stage):
            os.mkdir(d, 0o755)
        env = _env(cfg.get("Env"))
        workdir = os.path.normpath(os.path.join("/", str(cfg.get("WorkingDir") or "/")))

        def unpack_and_run() -> tuple[ProcessEnd, Unpacked, RunVerdict | None]:
            # the tree may be on a tmpfs only this process sees: classified here
            unpacked = unpack_root(image, lower, limits, options.max_unpack, options.tmpfs_bytes)
            uid, gid = _user(str(cfg.get("User") or ""), lower)
            if os.getuid() == 0 and _mapped(DROP_UID):
                _drop(work)  # else root of a user namespace that lacks 65534: no host root
            launch = Launch(lower, stage, tuple(argv), env, workdir, uid, gid, emulator, machines)
            end = namespaces.run(launch, options.limits)
            verdict = None if end.setup_error else classify(end, lower, options.timeout_fails)
            return end, unpacked, verdict

        process = ProcessLimits(wall_s=options.limits.deadline_s + 600.0)
        try:
            outcome, unpacked, verdict = run_isolated(unpack_and_run, process, image.label)
        finally:
            if emulator is not None:
                os.close(int(emulator.path.rsplit("/", 1)[1]))
        if outcome.setup_error or verdict is None:
            raise RunSetupError(f"{image.label} ({platform}): {outcome.setup_error}")
        return RunResult(str(platform), argv, outcome, verdict, unpacked)
    finally:
        remove_tree(work)


def _emulation(
    platform: Platform, options: RunOptions
) -> tuple[QemuSetup | None, tuple[int, ...] | None]:
    native = os.uname().machine
    if NATIVE.get(platform.architecture) == native:
        return None, None
    entry = QEMU.get(platform.architecture)
    if entry is None:
        raise RunSetupError(f"--run: no emulator known for {platform}")
    name, magic, mask, machine = entry
    found = (
        os.path.join(options.qemu_dir, f"{name}-static")
        if options.qemu_dir
        else shutil.which(f"{name}-static")
    )
    if not found or not os.access(found, os.X_OK):
        where = options.qemu_dir or "PATH"
        raise RunSetupError(f"--run {platform}: no {name}-static on {where} (--qemu-dir)")
    # opened here, named by its fd: a root caller's directory may be closed to the dropped uid
    fd = os.open(found, os.O_RDONLY)
    return QemuSetup(name, f"/proc/self/fd/{fd}", magic, mask, options.binfmt), (machine,)


def _mapped(uid: int) -> bool:
    """Whether `uid` exists in this process's user namespace (it always does in the
    initial one, where root must drop)."""
    with open("/proc/self/uid_map") as f:
        for line in f:
            inside, _, count = (int(n) for n in line.split())
            if inside <= uid < inside + count:
                return True
    return False


def _drop(work: str) -> None:
    """A root caller: the unpacked tree becomes nobody's, and so does this process."""
    for dirpath, dirnames, filenames in os.walk(work):
        for name in [*dirnames, *filenames]:
            os.lchown(os.path.join(dirpath, name), DROP_UID, DROP_GID)
    os.lchown(work, DROP_UID, DROP_GID)
    os.setgroups([])
    os.setresgid(DROP_GID, DROP_GID, DROP_GID)
    os.setresuid(DROP_UID, DROP_UID, DROP_UID)


def _argv(cfg: dict[str, object], args: tuple[str, ...] | None) -> list[str]:
    entrypoint, cmd = cfg.get("Entrypoint"), cfg.get("Cmd")
    argv = [str(a) for a in entrypoint] if isinstance(entrypoint, list) else []
    if args is not None:
        return argv + list(args)
    return argv + ([str(a) for a in cmd] if isinstance(cmd, list) else [])


def _env(raw: object) -> dict[str, str]:
    """The image's Env over what a runtime sets when the image does not."""
    return {
        "PATH": namespaces.DEFAULT_PATH,
        "HOSTNAME": "execwatch-run",
        "HOME": "/",
        **image_env(raw),
    }


def _user(spec: str, root: str) -> tuple[int, int]:
    """The image's User (uid, uid:gid, name or name:group) as ids; names from its
    /etc/passwd and /etc/group, read within the root."""
    user, _, group = spec.partition(":")
    uid = _id(user, os.path.join(root, "etc/passwd"), 2) if user else 0
    gid = _id(group, os.path.join(root, "etc/group"), 2) if group else None
    if gid is None:
        gid = _primary_gid(uid, root)
    return uid, gid


def _id(name: str, table: str, column: int) -> int:
    if name.isdigit():
        return int(name)
    for fields in _table(table):
        if fields[0] == name and len(fields) > column and fields[column].isdigit():
            return int(fields[column])
    raise RunSetupError(f"User {name!r}: not in the image's {table.rsplit('/', 2)[-2:]}")


def _primary_gid(uid: int, root: str) -> int:
    for fields in _table(os.path.join(root, "etc/passwd")):
        if len(fields) > 3 and fields[2] == str(uid) and fields[3].isdigit():
            return int(fields[3])
    return uid if uid else 0


def _table(path: str) -> list[list[str]]:
    try:
        if stat.S_ISLNK(os.lstat(path).st_mode):
            return []  # never a host file through a link
        with open(path, "rb") as f:
            text = f.read(1 << 20).decode(errors="replace")
    except OSError:
        return []
    return [line.split(":") for line in text.splitlines()[:10000]]


def _finding(run: RunResult, result: ImageResult) -> Finding:
    verdict = run.verdict
    program = run.outcome.program or run.argv[0]
    how = f" under QEMU ({run.outcome.emulation})" if run.outcome.emulation else ""
    message = f"run{how}: {verdict.detail} ({run.outcome.seconds:.2f} s)"
    if verdict.started:
        check, severity = Check.RUN_STARTED, Severity.NOTE
    else:
        assert verdict.reason is not None
        check, severity = CHECK_OF_REASON.get(verdict.reason, Check.RUN_FAILED), Severity.ERROR
    disagreement = _disagreement(verdict, program, result)
    if disagreement:
        message += f"; disagrees with the static verdict: {disagreement}"
    return Finding(check, severity, program, run.platform, message, True, "run", disagreement)


def _disagreement(verdict: RunVerdict, program: str, result: ImageResult) -> str | None:
    static = [f for f in result.findings if f.source == "static" and f.severity is Severity.ERROR]
    same = [f for f in static if f.path == program or (f.entrypoint and f.path.endswith(program))]
    if verdict.started and same:
        return f"the static side said {same[0].check} but it started"
    if not verdict.started and not same:
        return f"the static side says it runs, but the run failed ({verdict.reason})"
    return None
