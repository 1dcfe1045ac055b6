"""`scan --run --cpu-level`: the entrypoint in a system-mode QEMU microVM whose CPU is that
level, so an instruction the fleet's oldest nodes lack is a real SIGILL.

User-mode QEMU changes only what CPUID reports; a guest kernel on a CPU model without AVX
never enables AVX state, so an unmarked AVX2 instruction faults as it would on the node
(FACTS.md, "CPU levels"). The unpacked image root and a small static init
(smoke/guest/init.c) become a newc initramfs; QEMU (TCG, no network device) boots the
given kernel over it; the init runs the program and writes one report line on the second
serial port, marked with a nonce the program never sees. The host believes that line and
nothing else the guest prints, and kills QEMU at the deadline plus the boot budget.
"""

from __future__ import annotations

import os
import re
import resource
import secrets
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from importlib import resources
from typing import BinaryIO

from execwatch.binfmt.isa import BASELINE, V2, V3, V4, level_name
from execwatch.scan.errors import ScanInputError
from execwatch.smoke.namespaces import MiB, ProcessEnd, RunLimits

QEMU_SYSTEM = "qemu-system-x86_64"
INIT_NAME = ".execwatch-init"
ORDERS_NAME = ".execwatch-run"
# x86-64 level -> QEMU CPU model (TCG, QEMU 7.2), each checked in a guest (docs/scan.md):
# Opteron_G1 less SSE3 is the baseline (qemu64 has SSE3 and CX16); Nehalem has SSE4.2 and
# POPCNT but no AVX; Haswell has AVX2, BMI, FMA, MOVBE, less what TCG lacks (TSX, PCID,
# INVPCID, x2APIC, TSC deadline), which QEMU would drop with a warning each.
MODELS = {
    BASELINE: "Opteron_G1,-pni",
    V2: "Nehalem",
    V3: "Haswell,-pcid,-x2apic,-tsc-deadline,-hle,-rtm,-invpcid",
}
NO_V4 = "x86-64-v4: QEMU's TCG (7.2) has no AVX-512, so no microVM CPU of that level exists"
REPORT = re.compile(
    rb"EXECWATCH-REPORT-1 (?P<nonce>[0-9a-f]{32}) program=(?P<program>-|(?:[0-9a-f]{2})+)"
    rb" exec_errno=(?P<errno>-|-?[0-9]{1,5}) status=(?P<status>-|[0-9]{1,10})"
    rb" timed_out=(?P<timed_out>[01]) stdout=(?P<stdout>-|(?:[0-9a-f]{2})+)"
    rb" stderr=(?P<stderr>-|(?:[0-9a-f]{2})+) END (?P<end>[0-9a-f]{32})"
)
KEPT = 16 << 10  # of stdout and stderr, carried back over the serial port
SERIAL_CAP = 16 * MiB  # each serial port's file on the host


@dataclass(frozen=True)
class Vm:
    """What boots the microVM: checked before the image is unpacked."""

    qemu: str
    kernel: str
    model: str
    init: str
    boot_budget_s: float = 300.0  # TCG on a busy host; past deadline + this QEMU is killed
    max_initramfs: int = 1 << 30

    @property
    def emulation(self) -> str:
        return f"system ({self.model.split(',')[0]})"


@dataclass(frozen=True)
class Guest:
    """The program to run in the guest, as smoke.namespaces.Launch has it."""

    root: str
    argv: tuple[str, ...]
    env: dict[str, str]
    workdir: str
    uid: int
    gid: int


def cpu_model(levels: int) -> str:
    """The QEMU model of the highest level in `levels` (parse_level's bits)."""
    if levels & V4:
        raise ScanInputError(f"--cpu-level {NO_V4}")
    for bit in (V3, V2, BASELINE):
        if levels & bit:
            return MODELS[bit]
    raise ScanInputError(f"--cpu-level {level_name(levels)}: no QEMU CPU model for it")


def vm_for(levels: int, kernel: str | None, qemu_dir: str | None) -> Vm:
    """The microVM for a level, its kernel and QEMU: a missing piece is one line, exit 2."""
    model = cpu_model(levels)
    kernel = kernel or f"/boot/vmlinuz-{os.uname().release}"
    if not os.access(kernel, os.R_OK) or not os.path.isfile(kernel):
        raise ScanInputError(
            f"--cpu-level: no readable kernel {kernel} for the microVM (give --vm-kernel PATH)"
        )
    found = _qemu_system(qemu_dir)
    if found is None:
        where = f"in {qemu_dir} or on PATH" if qemu_dir else "on PATH"
        raise ScanInputError(f"--cpu-level: no {QEMU_SYSTEM} {where} (--qemu-dir)")
    init = resources.files("execwatch.smoke") / "guest" / "execwatch-init"
    if not init.is_file():
        raise ScanInputError(f"--cpu-level: {init} is missing: run `make guest-init`")
    return Vm(found, kernel, model, str(init))


def _qemu_system(qemu_dir: str | None) -> str | None:
    """From --qemu-dir, else PATH: the directory that holds qemu-aarch64-static for the
    arm64 runs need not hold the system emulator too."""
    candidates = [os.path.join(qemu_dir, QEMU_SYSTEM)] if qemu_dir else []
    candidates.append(shutil.which(QEMU_SYSTEM) or "")
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


def run_in_vm(
    vm: Vm, guest: Guest, limits: RunLimits, drop: tuple[int, int] | None = None
) -> ProcessEnd:
    """Boot the microVM over the guest's root, run its program, read the report. With
    `drop` (a root caller), QEMU runs as that uid and gid, on its own copy of the kernel
    (Debian's /boot/vmlinuz-* is root's alone)."""
    nonce = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="execwatch-vm-") as work:
        initrd = os.path.join(work, "initramfs.cpio")
        with open(initrd, "wb") as out:
            write_initramfs(out, guest, vm, _orders(nonce, guest, limits))
        size = os.path.getsize(initrd)
        if drop is not None:
            vm = _dropped(vm, work, drop)
        report, console = os.path.join(work, "report"), os.path.join(work, "console")
        started = time.monotonic()
        timed_out = _boot(vm, initrd, size, report, console, limits, drop)
        seconds = time.monotonic() - started
        outcome = parse_report(_tail(report, 1 << 20), nonce)
        if outcome is None:
            why = "killed at the deadline plus the boot budget" if timed_out else "no report"
            outcome = ProcessEnd(setup_error=f"the microVM gave {why}: {_last_line(console)}")
    outcome.emulation, outcome.seconds = vm.emulation, seconds
    return outcome


def _dropped(vm: Vm, work: str, drop: tuple[int, int]) -> Vm:
    kernel = shutil.copy(vm.kernel, os.path.join(work, "vmlinuz"))
    for path in (work, kernel, os.path.join(work, "initramfs.cpio")):
        os.chown(path, *drop)
    return replace(vm, kernel=kernel)


def _boot(
    vm: Vm, initrd: str, size: int, report: str, console: str, limits: RunLimits,
    drop: tuple[int, int] | None,
) -> bool:  # fmt: skip
    """Run QEMU to its end (as `drop`'s ids when given); True when the host had to kill it."""
    memory = 256 + 2 * size // MiB
    argv = [
        vm.qemu, *("-accel", "tcg", "-cpu", vm.model, "-m", str(memory), "-smp", "1"),
        *("-nodefaults", "-display", "none", "-no-reboot", "-nic", "none"),
        *("-serial", f"file:{console}", "-serial", f"file:{report}"),
        *("-kernel", vm.kernel, "-initrd", initrd),
        "-append", f"console=ttyS0 quiet panic=-1 rdinit=/{INIT_NAME} no_timer_check",
    ]  # fmt: skip
    uid, gid = drop if drop else (None, None)
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, user=uid, group=gid,
                            extra_groups=[] if drop else None,
                            preexec_fn=_cap_serial_files)  # fmt: skip
    try:
        proc.wait(timeout=limits.deadline_s + vm.boot_budget_s)
        return False
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return True


def _cap_serial_files() -> None:
    """In QEMU's process: the only files it writes are the serial ports', which the guest
    fills at will; past the cap a write fails (EFBIG) instead of filling the host's disk.
    A report lost that way is no report: exit 2, never a verdict."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (SERIAL_CAP, SERIAL_CAP))


def _orders(nonce: str, guest: Guest, limits: RunLimits) -> bytes:
    numbers = (
        int(limits.deadline_s * 1000), limits.cpu_s, limits.address_space, limits.processes,
        limits.open_files, limits.file_size, limits.tmp_bytes, min(limits.output_bytes, KEPT),
    )  # fmt: skip
    env = [f"{k}={v}" for k, v in guest.env.items()]
    fields = [nonce, str(guest.uid), str(guest.gid), guest.workdir, *map(str, numbers),
              str(len(guest.argv)), *guest.argv, str(len(env)), *env]  # fmt: skip
    return b"".join(os.fsencode(f) + b"\0" for f in fields)


def parse_report(data: bytes, nonce: str) -> ProcessEnd | None:
    """The init's one report line, believed only with this run's nonce at both ends; the
    last such line counts (the init writes it after the program has ended)."""
    found = None
    for line in data.replace(b"\r", b"").split(b"\n"):
        match = REPORT.fullmatch(line.strip())
        if match and match["nonce"] == match["end"] == nonce.encode():
            found = match
    if found is None:
        return None
    end = ProcessEnd(program=_unhex(found["program"]).decode(errors="replace") or None)
    end.stdout, end.stderr = _unhex(found["stdout"]), _unhex(found["stderr"])
    if found["errno"] != b"-":
        err = int(found["errno"])
        if err < 0:
            end.setup_error = f"the microVM's init could not become the image's user: errno {-err}"
        else:
            end.exec_errno = err
        return end
    if found["status"] == b"-":
        return None
    end.status, end.timed_out = int(found["status"]), found["timed_out"] == b"1"
    return end


def _unhex(text: bytes) -> bytes:
    return b"" if text == b"-" else bytes.fromhex(text.decode())


def _tail(path: str, limit: int) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - limit))
            return f.read(limit)
    except OSError:
        return b""


def _last_line(console: str) -> str:
    lines = [ln.strip() for ln in _tail(console, 4096).decode(errors="replace").splitlines()]
    lines = [ln for ln in lines if ln]
    return f"console: {lines[-1][:200]}" if lines else "the console is empty"


def write_initramfs(out: BinaryIO, guest: Guest, vm: Vm, orders: bytes) -> None:
    """The guest root as a newc cpio archive, then the orders and the init (last: they win
    over an image's file of the same name); past vm.max_initramfs bytes, one line, exit 2."""
    writer = _Cpio(out, vm.max_initramfs)
    for rel, st in _tree(guest.root):
        path = os.path.join(guest.root, rel)
        if stat.S_ISDIR(st.st_mode):
            writer.entry(rel, stat.S_IFDIR | stat.S_IMODE(st.st_mode), b"")
        elif stat.S_ISLNK(st.st_mode):
            writer.entry(rel, stat.S_IFLNK | 0o777, os.fsencode(os.readlink(path)))
        elif stat.S_ISREG(st.st_mode):
            with open(path, "rb") as f:
                writer.file(rel, stat.S_IFREG | stat.S_IMODE(st.st_mode), f, st.st_size)
    writer.entry(ORDERS_NAME, stat.S_IFREG | 0o400, orders)
    with open(vm.init, "rb") as f:
        writer.file(INIT_NAME, stat.S_IFREG | 0o500, f, os.fstat(f.fileno()).st_size)
    writer.entry("TRAILER!!!", 0, b"")


def _tree(root: str) -> Iterator[tuple[str, os.stat_result]]:
    """Every path under `root` (relative), a directory before what it holds; links not
    followed."""
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            path = os.path.join(dirpath, name)
            yield os.path.relpath(path, root), os.lstat(path)


class _Cpio:
    """A newc archive written as it goes, every entry owned by root, its size budgeted."""

    def __init__(self, out: BinaryIO, budget: int) -> None:
        self.out, self.budget, self.written, self.ino = out, budget, 0, 0

    def _header(self, name: str, mode: int, size: int) -> None:
        self.ino += 1
        encoded = os.fsencode(name) + b"\0"
        fields = (self.ino, mode, 0, 0, 1, 0, size, 0, 0, 0, 0, len(encoded), 0)
        head = b"070701" + b"".join(b"%08X" % f for f in fields) + encoded
        self._write(head + b"\0" * (-len(head) % 4))

    def _write(self, data: bytes) -> None:
        self.written += len(data)
        if self.written > self.budget:
            raise ScanInputError(
                f"--cpu-level: the image root exceeds the microVM's {self.budget // MiB} MiB"
                " initramfs budget"
            )
        self.out.write(data)

    def entry(self, name: str, mode: int, data: bytes) -> None:
        self._header(name, mode, len(data))
        self._write(data + b"\0" * (-len(data) % 4))

    def file(self, name: str, mode: int, f: BinaryIO, size: int) -> None:
        self._header(name, mode, size)
        left = size
        while left > 0:
            chunk = f.read(min(left, MiB))
            if not chunk:
                raise ScanInputError(f"{name}: changed while being read")
            self._write(chunk)
            left -= len(chunk)
        self._write(b"\0" * (-size % 4))
