"""Start one program of an unpacked image in namespaces of its own, fit for untrusted code.

Three processes: the caller reads the program's output; a monitor, forked, unshares user,
mount, PID, network, IPC and UTS namespaces and forks the namespace's init; the init mounts
the root (an overlay over the unpacked tree, its writes on a size-capped tmpfs: the tree
and the host are never written; before Linux 5.11, which has no overlay in a user
namespace, a copy of the tree in that tmpfs), a fresh /proc, a minimal /dev and a capped
/tmp, brings up the loopback interface, pivots into the root, sets rlimits and
`no_new_privs`, and execs the program as PID 1, as a container's entrypoint is. The
monitor kills that PID 1 at the deadline, which kills every process of the namespace.

The user namespace maps one id: the image's user onto the caller's own (unprivileged)
uid. Nothing is privileged outside the namespace; a root caller drops to an unprivileged
uid before (smoke.runs). Setup failures are one line each.
"""

from __future__ import annotations

import errno
import json
import os
import resource
import select
import shutil
import signal
import stat
import time
from dataclasses import dataclass, field

from execwatch.smoke.kernel import (
    CLONE_NEWIPC,
    CLONE_NEWNET,
    CLONE_NEWNS,
    CLONE_NEWPID,
    CLONE_NEWUSER,
    CLONE_NEWUTS,
    MNT_DETACH,
    MS_BIND,
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    MS_PRIVATE,
    MS_REC,
    PR_SET_DUMPABLE,
    PR_SET_NO_NEW_PRIVS,
    PR_SET_PDEATHSIG,
    Kernel,
    loopback_up,
)

NAMESPACES = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
QEMU_IN_ROOT = "/.execwatch-qemu"
SYSCTLS = (
    ("/proc/sys/kernel/apparmor_restrict_unprivileged_userns", "1"),
    ("/proc/sys/kernel/unprivileged_userns_clone", "0"),
    ("/proc/sys/user/max_user_namespaces", "0"),
)
MiB = 1 << 20


class SandboxRefused(Exception):
    """The kernel refuses an unprivileged user namespace here: one line naming the setting."""


@dataclass(frozen=True)
class RunLimits:
    deadline_s: float = 10.0  # wall clock: past it the namespace's PID 1 is killed
    cpu_s: int = 30  # RLIMIT_CPU
    address_space: int = 4096 * MiB  # RLIMIT_AS
    processes: int = 256  # RLIMIT_NPROC: counted per user namespace
    open_files: int = 1024  # RLIMIT_NOFILE
    file_size: int = 256 * MiB  # RLIMIT_FSIZE
    writable_bytes: int = 256 * MiB  # the root's writable layer (a tmpfs)
    tmp_bytes: int = 64 * MiB  # /tmp
    output_bytes: int = 64 << 10  # of stdout and of stderr, kept


@dataclass(frozen=True)
class QemuSetup:
    """User-mode QEMU for a foreign ELF machine, as binfmt_misc describes it."""

    name: str  # qemu-aarch64
    path: str  # the static interpreter: /proc/self/fd/N of an fd the caller opened
    magic: bytes
    mask: bytes
    binfmt: bool = True  # register it in the namespace's binfmt_misc; else run it directly

    def matches(self, head: bytes) -> bool:
        if len(head) < len(self.magic):
            return False
        return all((h & m) == (g & m) for h, m, g in zip(head, self.mask, self.magic, strict=False))

    def register_line(self) -> str:
        def hexed(data: bytes) -> str:
            return "".join(f"\\x{b:02x}" for b in data)

        return f":{self.name}:M::{hexed(self.magic)}:{hexed(self.mask)}:{self.path}:F"


@dataclass(frozen=True)
class Launch:
    lower: str  # the unpacked root, never written
    stage: str  # an empty directory for the sandbox's own mounts
    argv: tuple[str, ...]
    env: dict[str, str]
    workdir: str = "/"
    uid: int = 0  # inside the namespace
    gid: int = 0
    emulator: QemuSetup | None = None
    # ELF machines (e_machine) the platform's node runs: another ELF entrypoint is refused
    # with ENOEXEC as that node's kernel would (None: whatever this kernel runs)
    machines: tuple[int, ...] | None = None
    hostname: str = "execwatch-run"


@dataclass
class ProcessEnd:
    status: int | None = None  # the program's wait status
    exec_errno: int | None = None  # execve refused it
    program: str | None = None  # the path that was (or would have been) executed
    setup_error: str | None = None
    timed_out: bool = False
    emulation: str | None = None  # "binfmt_misc" or "direct" for a foreign program
    stdout: bytes = b""
    stderr: bytes = b""
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)


def private_tmpfs(path: str, size: int) -> bool:
    """A tmpfs of at most `size` bytes on `path`, in a mount namespace of this process's
    own (for an unprivileged caller inside a user namespace that maps only its own uid
    and gid): only this process and its children see it, and the kernel frees it when
    the last of them exits, so nothing is left behind however they end. False where the
    kernel refuses; this process may then be in a namespace of its own, which changes
    nothing else it does."""
    kernel = Kernel()
    uid, gid = os.getuid(), os.getgid()
    try:
        if uid == 0:
            kernel.unshare(CLONE_NEWNS)
        else:
            kernel.unshare(CLONE_NEWUSER | CLONE_NEWNS)
            _map_ids((uid, gid), uid, gid)
        kernel.mount("none", "/", "", MS_REC | MS_PRIVATE)
        kernel.mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},mode=755")
    except OSError:
        return False
    return True


def refusal() -> str | None:
    """Why this process cannot make a user namespace (one line), or None when it can."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - a probe child
        try:
            Kernel().unshare(CLONE_NEWUSER)
        except OSError as exc:
            os._exit(exc.errno or 1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    return None if code == 0 else refusal_text(code)


def refusal_text(err: int) -> str:
    for path, bad in SYSCTLS:
        try:
            with open(path) as f:
                value = f.read().strip()
        except OSError:
            continue
        if value == bad:
            sysctl = path.removeprefix("/proc/sys/").replace("/", ".")
            return f"unprivileged user namespaces are refused here ({sysctl} = {value}): cannot run"
    names = ", ".join(p.removeprefix("/proc/sys/").replace("/", ".") for p, _ in SYSCTLS)
    return (
        f"cannot create a user namespace ({os.strerror(err)}): check {names},"
        " or the container runtime's seccomp/AppArmor profile"
    )


def run(launch: Launch, limits: RunLimits) -> ProcessEnd:
    """Start the program and wait for it, its deadline, or its setup's failure."""
    started = time.monotonic()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    info_r, info_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the monitor; its outcome is asserted by the caller
        code = 1
        try:
            for fd in (out_r, err_r, info_r):
                os.close(fd)
            _monitor(launch, limits, (out_w, err_w), info_w)
            code = 0
        except BaseException as exc:
            _say(info_w, setup_error=f"{type(exc).__name__}: {exc}")
        finally:
            os._exit(code)
    for fd in (out_w, err_w, info_w):
        os.close(fd)
    streams = _drain({out_r: b"", err_r: b"", info_r: b""}, limits, started)
    for fd in (out_r, err_r, info_r):
        os.close(fd)
    if streams is None:
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    outcome = _outcome(streams[info_r] if streams else b"")
    if streams is None:
        outcome.setup_error = outcome.setup_error or "the sandbox's monitor did not answer"
    else:
        outcome.stdout, outcome.stderr = streams[out_r], streams[err_r]
    outcome.seconds = time.monotonic() - started
    return outcome


def _drain(bufs: dict[int, bytes], limits: RunLimits, started: float) -> dict[int, bytes] | None:
    """Every stream until all close, each kept to output_bytes; None past a backstop
    (the monitor's own deadline plus a margin)."""
    backstop = started + limits.deadline_s + 30.0
    open_fds = set(bufs)
    while open_fds:
        wait = backstop - time.monotonic()
        if wait <= 0:
            return None
        ready, _, _ = select.select(list(open_fds), [], [], wait)
        for fd in ready:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                open_fds.discard(fd)
            elif len(bufs[fd]) < limits.output_bytes:
                bufs[fd] = (bufs[fd] + chunk)[: limits.output_bytes]
    return bufs


def _outcome(info: bytes) -> ProcessEnd:
    outcome = ProcessEnd()
    for line in info.splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict):
            for key, value in item.items():
                if key == "note":
                    outcome.notes.append(str(value))
                elif hasattr(outcome, key):
                    setattr(outcome, key, value)
    return outcome


def _say(fd: int, **item: object) -> None:
    os.write(fd, (json.dumps(item) + "\n").encode())


def _monitor(launch: Launch, limits: RunLimits, out: tuple[int, int], info: int) -> None:
    """In the caller's PID namespace: make the namespaces, fork their init, wait for it."""
    kernel = Kernel()
    kernel.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    kernel.prctl(PR_SET_DUMPABLE, 1)  # a root caller's drop made /proc/self root's
    uid, gid = os.getuid(), os.getgid()
    try:
        kernel.unshare(NAMESPACES)
    except OSError as exc:
        _say(info, setup_error=refusal_text(exc.errno or errno.EPERM))
        return
    _map_ids((launch.uid, launch.gid), uid, gid)
    exec_r, exec_w = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the namespace's init, then the program
        os.close(exec_r)
        os.close(info)
        _init(kernel, launch, limits, out, exec_w)
    os.close(exec_w)
    for fd in out:
        os.close(fd)
    deadline = time.monotonic() + limits.deadline_s
    report = _read_until(exec_r, deadline)
    os.write(info, report)
    pidfd = os.pidfd_open(pid)
    ready, _, _ = select.select([pidfd], [], [], max(0.0, deadline - time.monotonic()))
    if not ready:
        os.kill(pid, signal.SIGKILL)  # PID 1: the kernel kills the whole namespace
        _say(info, timed_out=True)
    _, status = os.waitpid(pid, 0)
    _say(info, status=status)


def _read_until(fd: int, deadline: float) -> bytes:
    data = b""
    while True:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            return data
        chunk = os.read(fd, 4096)
        if not chunk:
            return data
        data += chunk


def _map_ids(inside: tuple[int, int], uid: int, gid: int) -> None:
    """A new user namespace's only ids: `inside` (uid, gid) as the caller's `uid`, `gid`."""
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"{inside[0]} {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"{inside[1]} {gid} 1")


def _init(
    kernel: Kernel, launch: Launch, limits: RunLimits, out: tuple[int, int], report: int
) -> None:
    code = 127
    try:
        kernel.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        os.setsid()
        null = os.open("/dev/null", os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out[0], 1)
        os.dup2(out[1], 2)
        try:
            argv, program = _prepare(kernel, launch, limits, report)
        except OSError as exc:
            _say(report, setup_error=str(exc.strerror or exc))
            code = 126
            return
        _say(report, program=program)
        try:
            if not _runs_here(program, launch.machines):
                raise OSError(errno.ENOEXEC, "Exec format error")
            os.execve(argv[0], argv, launch.env)
        except OSError as exc:
            _say(report, exec_errno=exc.errno)
    except BaseException as exc:
        _say(report, setup_error=f"{type(exc).__name__}: {exc}")
    finally:
        os._exit(code)


def _prepare(
    kernel: Kernel, launch: Launch, limits: RunLimits, report: int
) -> tuple[list[str], str]:
    """Mounts, pivot, limits: the argv to exec (maybe through QEMU) and the program's path."""
    kernel.mount("none", "/", "", MS_REC | MS_PRIVATE)
    new = _root(kernel, launch, limits)
    emulation = _emulation(kernel, launch, new)
    if emulation is not None:
        _say(report, emulation=emulation)
    kernel.sethostname(launch.hostname)
    loopback_up()
    os.chdir(new)
    kernel.pivot_root(".", ".")
    kernel.umount(".", MNT_DETACH)
    os.chdir("/")
    os.makedirs(launch.workdir, exist_ok=True)
    os.chdir(launch.workdir)
    program = find_program(launch.argv[0], launch.env.get("PATH", DEFAULT_PATH))
    _limit(limits)
    kernel.prctl(PR_SET_NO_NEW_PRIVS, 1)
    argv = [program, *launch.argv[1:]]
    if emulation == "direct" and launch.emulator is not None and _foreign(program, launch.emulator):
        argv = [QEMU_IN_ROOT, "-0", launch.argv[0], program, *launch.argv[1:]]
    return argv, program


def _root(kernel: Kernel, launch: Launch, limits: RunLimits) -> str:
    stage = launch.stage
    kernel.mount("tmpfs", stage, "tmpfs", MS_NOSUID | MS_NODEV, f"size={limits.writable_bytes}")
    for name in ("upper", "work", "root", "dev"):
        os.mkdir(f"{stage}/{name}")
    new = f"{stage}/root"
    try:
        kernel.mount(
            "overlay", new, "overlay", MS_NOSUID,
            f"lowerdir={launch.lower},upperdir={stage}/upper,workdir={stage}/work,userxattr",
        )  # fmt: skip
    except OSError:  # Linux < 5.11 has no overlay in a user namespace (nor `userxattr`)
        _copy_tree(launch.lower, new)
        kernel.mount(new, new, "", MS_BIND)  # pivot_root wants a mount point
    for name in ("proc", "dev", "tmp"):
        _directory(f"{new}/{name}")
    kernel.mount("proc", f"{new}/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    kernel.mount("tmpfs", f"{new}/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "size=1m,mode=755")
    for name in DEVICES:
        with open(f"{new}/dev/{name}", "w"):
            pass
        kernel.mount(f"/dev/{name}", f"{new}/dev/{name}", "", MS_BIND)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):  # fmt: skip
        os.symlink(target, f"{new}/dev/{name}")
    os.mkdir(f"{new}/dev/shm")
    kernel.mount("tmpfs", f"{new}/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "size=16m")
    kernel.mount(
        "tmpfs", f"{new}/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={limits.tmp_bytes},mode=1777"
    )
    return new


def _copy_tree(src: str, dst: str) -> None:
    """The unpacked tree copied into the stage's size-capped tmpfs, where an overlay cannot
    be mounted: directories, regular files and symlinks (what the unpacking admits), the
    tmpfs's size its budget (ENOSPC past it, a setup failure)."""
    modes: list[tuple[str, int]] = []  # a directory's own mode, set once it is filled
    for top, dirs, files in os.walk(src):
        into = os.path.normpath(os.path.join(dst, os.path.relpath(top, src)))
        for name in dirs + files:
            source, target = os.path.join(top, name), os.path.join(into, name)
            st = os.lstat(source)
            if stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(source), target)
            elif stat.S_ISDIR(st.st_mode):
                os.mkdir(target, 0o700)
                modes.append((target, stat.S_IMODE(st.st_mode)))
            elif stat.S_ISREG(st.st_mode):
                shutil.copyfile(source, target, follow_symlinks=False)
                os.chmod(target, stat.S_IMODE(st.st_mode))
    for target, mode in reversed(modes):
        os.chmod(target, mode)


def _directory(path: str) -> None:
    """A mount point in the root: an image's symlink or file there is replaced."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        os.mkdir(path)
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(path)
        os.mkdir(path)


def _emulation(kernel: Kernel, launch: Launch, new: str) -> str | None:
    """QEMU in the namespace's own binfmt_misc (Linux 6.7+), else bound into the root to be
    run directly."""
    emulator = launch.emulator
    if emulator is None:
        return None
    if emulator.binfmt:
        mountpoint = f"{new}/proc/sys/fs/binfmt_misc"
        try:
            kernel.mount("binfmt_misc", mountpoint, "binfmt_misc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
            with open(f"{mountpoint}/register", "w") as f:
                f.write(emulator.register_line())
            return "binfmt_misc"
        except OSError:
            pass  # an older kernel, or a refused mount: QEMU is run directly
    # a copy in the root's writable layer: a bind mount of a file opened in the caller's
    # mount namespace is refused (EINVAL), and its directory may be closed to this uid
    with open(emulator.path, "rb") as src, open(f"{new}{QEMU_IN_ROOT}", "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    os.chmod(f"{new}{QEMU_IN_ROOT}", 0o555)
    return "direct"


def _foreign(program: str, emulator: QemuSetup) -> bool:
    try:
        with open(program, "rb") as f:
            return emulator.matches(f.read(len(emulator.magic)))
    except OSError:
        return False


def _runs_here(program: str, machines: tuple[int, ...] | None) -> bool:
    if machines is None:
        return True
    try:
        with open(program, "rb") as f:
            head = f.read(20)
    except OSError:
        return True  # the exec itself says why
    if len(head) < 20 or not head.startswith(b"\x7fELF"):
        return True
    little = head[5] == 1
    return int.from_bytes(head[18:20], "little" if little else "big") in machines


def find_program(name: str, path: str) -> str:
    """runc's lookup: a name with a slash as given, else the first executable file on PATH;
    a name found nowhere is returned as is (its exec then fails with ENOENT)."""
    if "/" in name:
        return name
    for directory in path.split(":"):
        candidate = os.path.join(directory or ".", name)
        try:
            st = os.stat(candidate)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and st.st_mode & 0o111:
            return candidate
    return name


def _limit(limits: RunLimits) -> None:
    for which, value in (
        (resource.RLIMIT_CPU, limits.cpu_s),
        (resource.RLIMIT_AS, limits.address_space),
        (resource.RLIMIT_NPROC, limits.processes),
        (resource.RLIMIT_NOFILE, limits.open_files),
        (resource.RLIMIT_FSIZE, limits.file_size),
    ):
        _, hard = resource.getrlimit(which)
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(which, (value, value))
