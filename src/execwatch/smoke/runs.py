"""`execwatch scan IMAGE --run`: unpack each platform's image, start its entrypoint in the
sandbox, and put the outcome into the scan's report as findings with `source: run`."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace

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
from execwatch.smoke.microvm import Guest, Vm, run_in_vm, vm_for
from execwatch.smoke.namespaces import Launch, ProcessEnd, QemuSetup, RunLimits
from execwatch.smoke.unpack import TMPFS_BYTES, Unpacked, remove_tree, unpack_image, unpack_root

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
    cpu_levels: int | None = None  # --cpu-level: amd64 runs in a microVM of that CPU
    vm_kernel: str | None = None  # --vm-kernel: the microVM's kernel
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
    chosen = []
    for image in images:
        platform = image.platform or image.config_platform() or node_platform()
        if not platforms or any(platform.matches(p) for p in platforms):
            chosen.append((image, platform))
    problem = None
    if not all(_in_microvm(platform, options) for _, platform in chosen):
        problem = namespaces.refusal()  # a microVM needs no user namespace
    if problem:
        raise RunSetupError(problem)
    done = [(image, platform, run_image(image, platform, options, limits))
            for image, platform in chosen]  # fmt: skip
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
    vm = _vm(platform, options)
    emulator, machines = (None, None) if vm else _emulation(platform, options)
    work = tempfile.mkdtemp(prefix="execwatch-run-")
    try:
        os.chmod(work, 0o755)
        lower, stage = os.path.join(work, "root"), os.path.join(work, "stage")
        for d in (lower, stage):
            os.mkdir(d, 0o755)
        env = _env(cfg.get("Env"))
        workdir = os.path.normpath(os.path.join("/", str(cfg.get("WorkingDir") or "/")))
        user = str(cfg.get("User") or "")
        if vm is not None:
            guest = Guest(lower, tuple(argv), env, workdir, 0, 0)
            outcome, unpacked = _in_vm(vm, image, guest, user, options, limits)
            verdict = (
                None if outcome.setup_error else classify(outcome, lower, options.timeout_fails)
            )
        else:
            launch = Launch(lower, stage, tuple(argv), env, workdir, 0, 0, emulator, machines)
            outcome, unpacked, verdict = _in_namespaces(image, launch, user, work, options, limits)
        if outcome.setup_error or verdict is None:
            raise RunSetupError(f"{image.label} ({platform}): {outcome.setup_error}")
        return RunResult(str(platform), argv, outcome, verdict, unpacked)
    finally:
        remove_tree(work)


def _in_namespaces(
    image: ImageSource, launch: Launch, user: str, work: str, options: RunOptions, limits: Limits
) -> tuple[ProcessEnd, Unpacked, RunVerdict | None]:
    """Unpack, run and classify in a process of its own, dropped to nobody for a root
    caller: the tree may be on a tmpfs only that process sees."""

    def unpack_and_run() -> tuple[ProcessEnd, Unpacked, RunVerdict | None]:
        lower = launch.lower
        unpacked = unpack_root(image, lower, limits, options.max_unpack, options.tmpfs_bytes)
        uid, gid = _user(user, lower)
        if os.getuid() == 0 and _mapped(DROP_UID):
            _drop(work)  # else root of a user namespace that lacks 65534: no host root
        end = namespaces.run(replace(launch, uid=uid, gid=gid), options.limits)
        verdict = None if end.setup_error else classify(end, lower, options.timeout_fails)
        return end, unpacked, verdict

    process = ProcessLimits(wall_s=options.limits.deadline_s + 600.0)
    try:
        return run_isolated(unpack_and_run, process, image.label)
    finally:
        if launch.emulator is not None:
            os.close(int(launch.emulator.path.rsplit("/", 1)[1]))


def _vm(platform: Platform, options: RunOptions) -> Vm | None:
    """--cpu-level: an amd64 platform runs in a microVM of that level (the level is an
    amd64 notion: other platforms run as without it)."""
    if options.cpu_levels is None or not _in_microvm(platform, options):
        return None
    return vm_for(options.cpu_levels, options.vm_kernel, options.qemu_dir)


def _in_microvm(platform: Platform, options: RunOptions) -> bool:
    return options.cpu_levels is not None and platform.architecture == "amd64"


def _in_vm(
    vm: Vm, image: ImageSource, guest: Guest, user: str, options: RunOptions, limits: Limits
) -> tuple[ProcessEnd, Unpacked]:
    """Unpack in a process of its own (as every run does), then boot the microVM from here:
    QEMU needs more address space than the unpacking process may have. A root caller's
    QEMU runs as nobody, as its sandbox would."""

    def unpack() -> tuple[Unpacked, tuple[int, int]]:
        return unpack_image(image, guest.root, limits, options.max_unpack), _user(user, guest.root)

    unpacked, (uid, gid) = run_isolated(unpack, ProcessLimits(wall_s=600.0), image.label)
    drop = (DROP_UID, DROP_GID) if os.getuid() == 0 and _mapped(DROP_UID) else None
    return run_in_vm(vm, replace(guest, uid=uid, gid=gid), options.limits, drop), unpacked


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
    emulation = run.outcome.emulation
    how = ""
    if emulation:  # "system (Nehalem)" for the microVM, else user mode's binfmt_misc/direct
        how = (
            f" under QEMU {emulation}"
            if emulation.startswith("system")
            else f" under QEMU ({emulation})"
        )
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
