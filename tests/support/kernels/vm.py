"""Boot a Debian kernel under QEMU with this host's root shared read-only over 9p.

The guest's /init (busybox) loads the virtio, 9p and binfmt_misc modules of that kernel, mounts the
host's root at /host, mounts proc, sys, dev, tmpfs, tracefs, bpffs and cgroup2 over
its directories, and runs one command chrooted there: the repository's own code and
virtualenv, at the same paths as on the host. A second, writable 9p export carries
the results back. TCG, not KVM: this machine's KVM is PVM, which Debian's kernels lack.
"""

from __future__ import annotations

import contextlib
import json
import lzma
import shlex
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
# The Debian releases whose kernels dev/fetch-kernels.sh fetches (the kernel matrix).
RELEASES = ("bullseye", "bookworm", "trixie", "sid")  # dev/fetch-kernels.sh
KERNELS = REPO / ".cache" / "kernels"
BUSYBOX = Path("/bin/busybox")
# Load order; each kernel builds some of them in, and 6.x splits virtio_pci in three.
MODULES = (
    "virtio",
    "virtio_ring",
    "virtio_pci_modern_dev",
    "virtio_pci_legacy_dev",
    "virtio_pci",
    "netfs",
    "fscache",
    "9pnet",
    "9pnet_virtio",
    "9p",
    "binfmt_misc",  # the guest registers an emulator (tests/kernels/guest.py)
    "overlay",  # `execwatch scan --run`'s root, where the kernel allows it (guest_smoke.py)
)
GUEST_OUT = "/tmp/out"  # where the writable export is mounted, inside the chroot
GUEST_TMPFS = ("/tmp", "/run")
# A clone under /tmp (as CI may make), or its .cache's target there (XDG_CACHE_HOME, HOME),
# would vanish under the guest's tmpfs: each is bound aside in the initramfs first and
# bound back over the tmpfs.
KEEP = "/keep"
NINEP = "trans=virtio,version=9p2000.L,msize=262144,cache=loose"


@dataclass(frozen=True)
class Kernel:
    release: str
    version: str
    vmlinuz: Path
    modules: Path

    @classmethod
    def fetched(cls, release: str) -> Kernel:
        """A kernel unpacked by dev/fetch-kernels.sh; an AssertionError names what is missing."""
        root = KERNELS / release
        if not (root / ".complete-v2").exists():
            raise AssertionError(f"{root} is missing: run dev/fetch-kernels.sh (make test does)")
        version = (root / "version").read_text().strip()
        return cls(release, version, root / "vmlinuz", root / "modules")

    def module_files(self) -> list[tuple[str, bytes]]:
        """(name, uncompressed .ko) in load order, for the modules this kernel ships."""
        found = {}
        for path in self.modules.rglob("*.ko*"):
            name = path.name.split(".ko")[0]
            if name in MODULES:
                data = path.read_bytes()
                found[name] = lzma.decompress(data) if path.name.endswith(".xz") else data
        return [(name, found[name]) for name in MODULES if name in found]


def _masked(path: Path) -> bool:
    return any(path.is_relative_to(d) for d in GUEST_TMPFS)


def kept_paths(repo: Path = REPO) -> list[Path]:
    """The repository and its cache's real directory, where the guest's tmpfs hides them."""
    wanted = [p for p in (repo, (repo / ".cache").resolve()) if _masked(p)]
    return [p for p in wanted if not any(p != q and p.is_relative_to(q) for q in wanted)]


def init_script(modules: list[str], command: str, switch_root: bool = False) -> str:
    """`switch_root`: the host's root is moved over the initramfs's / before the command
    runs there (as switch_root does), not entered with chroot: a chrooted process may not
    create a user namespace (EPERM), which `execwatch scan --run` needs."""
    kept = kept_paths()
    mounts = [
        ("proc", "proc", "/proc"),
        ("sysfs", "sysfs", "/sys"),
        ("devtmpfs", "devtmpfs", "/dev"),
        *(("tmpfs", "tmpfs", d) for d in GUEST_TMPFS),
        ("tracefs", "tracefs", "/sys/kernel/tracing"),
        ("debugfs", "debugfs", "/sys/kernel/debug"),
        ("bpf", "bpf", "/sys/fs/bpf"),
        ("cgroup2", "cgroup2", "/sys/fs/cgroup"),
    ]
    lines = [
        "#!/bin/busybox sh",
        "/bin/busybox --install -s /bin",
        "export PATH=/bin",
        "mkdir -p /proc /sys /dev /host",
        "mount -t proc proc /proc && mount -t sysfs sysfs /sys && mount -t devtmpfs dev /dev",
        # Dependencies differ between kernels (virtio_ring before virtio from 6.1 on):
        # retry until every module is in.
        f"left='{' '.join(modules)}'",
        "for pass in 1 2 3 4; do next=''",
        '  for m in $left; do insmod /modules/$m.ko 2>/dev/null || next="$next $m"; done',
        "  left=$next; done",
        '[ -z "$left" ] || { echo "ew-init: cannot load$left"; dmesg | tail -5; }',
        f"mount -t 9p -o {NINEP},ro host /host || echo 'ew-init: no host root'",
        *(f"mkdir -p {KEEP}/{i} && mount -o bind /host{p} {KEEP}/{i}" for i, p in enumerate(kept)),
        *(f"mount -t {t} {s} /host{d} || echo 'ew-init: mount {d} failed'" for t, s, d in mounts),
        *(f"mkdir -p /host{p} && mount -o bind {KEEP}/{i} /host{p}" for i, p in enumerate(kept)),
        f"mkdir -p /host{GUEST_OUT} && mount -t 9p -o {NINEP} out /host{GUEST_OUT}",
        "ip link set lo up",
        "echo ew-init: ready",
        *(_switched(command) if switch_root else _chrooted(command)),
    ]
    return "\n".join(lines) + "\n"


def _chrooted(command: str) -> list[str]:
    return [
        f"chroot /host /bin/sh -c {shlex.quote(f'cd {REPO} && exec {command}')}"
        f" >/host{GUEST_OUT}/guest.log 2>&1",
        f"echo $? >/host{GUEST_OUT}/rc",
        f"sync; umount /host{GUEST_OUT}",
        "echo ew-init: done",
        "poweroff -f",
    ]


def _switched(command: str) -> list[str]:
    """The host's root moved over /, and the rest run there (a path lookup from the
    initramfs's own root would not see the move): the host's own busybox powers off."""
    rest = (
        f"(cd {REPO} && exec {command}) >{GUEST_OUT}/guest.log 2>&1; echo $? >{GUEST_OUT}/rc;"
        f" /bin/busybox sync; /bin/busybox umount {GUEST_OUT}; echo ew-init: done;"
        " /bin/busybox poweroff -f"
    )
    return [  # switch_root's order: into the new root, move it, then chroot to "."
        "cd /host",
        "mount --move /host / || echo 'ew-init: cannot move the host root over /'",
        f"exec chroot . /bin/sh -c {shlex.quote(rest)}",
    ]


def cpio(entries: list[tuple[str, int, bytes]]) -> bytes:
    """A newc cpio archive (what the kernel unpacks as initramfs): (name, mode, data)."""
    out = bytearray()
    for ino, (name, mode, data) in enumerate([*entries, ("TRAILER!!!", 0, b"")], start=1):
        encoded = name.encode() + b"\0"
        fields = (ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(encoded), 0)
        out += b"070701" + b"".join(b"%08X" % f for f in fields) + encoded
        out += b"\0" * (-len(out) % 4)
        out += data + b"\0" * (-len(data) % 4)
    return bytes(out)


def build_initramfs(kernel: Kernel, command: str, dest: Path, switch_root: bool = False) -> Path:
    modules = kernel.module_files()
    dirs = ("bin", "modules", "proc", "sys", "dev", "host")
    entries = [(d, 0o40755, b"") for d in dirs]
    entries.append(("bin/busybox", 0o100755, BUSYBOX.read_bytes()))
    entries += [(f"modules/{name}.ko", 0o100644, data) for name, data in modules]
    script = init_script([name for name, _ in modules], command, switch_root)
    entries.append(("init", 0o100755, script.encode()))
    dest.write_bytes(cpio(entries))
    return dest


@dataclass
class Boot:
    """One guest run: its console log, the command's exit status and its output directory."""

    kernel: Kernel
    out: Path
    console: str
    seconds: float

    @property
    def rc(self) -> int | None:
        path = self.out / "rc"
        return int(path.read_text()) if path.exists() else None

    @property
    def guest_log(self) -> str:
        path = self.out / "guest.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def result(self) -> dict[str, Any]:
        """The guest command's OUT/result.json; an AssertionError explains a guest that
        failed or wrote none."""
        path = self.out / "result.json"
        assert self.rc == 0 and path.exists(), self.explain()
        doc: dict[str, Any] = json.loads(path.read_text())
        return doc

    def explain(self) -> str:
        return (
            f"{self.kernel.release} ({self.kernel.version}) after {self.seconds:.0f}s, rc={self.rc}"
            f"\n--- console (tail)\n{self.console[-3000:]}\n--- guest.log (tail)\n"
            f"{self.guest_log[-5000:]}"
        )


class Vm:
    """A started QEMU process; wait() returns its Boot."""

    def __init__(
        self,
        kernel: Kernel,
        command: str,
        workdir: Path,
        memory_mb: int = 1024,
        cpu: str = "max",
        switch_root: bool = False,
    ) -> None:
        self.kernel = kernel
        self.out = workdir / "out"
        self.out.mkdir(parents=True, exist_ok=True)  # a test may put its files there first
        initrd = build_initramfs(kernel, command, workdir / "initramfs.cpio", switch_root)
        self.console_path = workdir / "console.log"
        # no_timer_check: on a starved host TCG's timer can look broken to the IO-APIC
        # check, which then panics the guest.
        argv = [
            "qemu-system-x86_64",
            *("-accel", "tcg", "-cpu", cpu, "-m", str(memory_mb), "-smp", "1"),
            *("-nographic", "-no-reboot", "-monitor", "none", "-serial", "stdio"),
            *("-kernel", str(kernel.vmlinuz), "-initrd", str(initrd)),
            *("-append", "console=ttyS0 panic=-1 quiet no_timer_check"),
            "-virtfs",
            "local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap",
            "-virtfs",
            f"local,path={self.out},mount_tag=out,security_model=none",
        ]
        self.started = time.monotonic()
        with self.console_path.open("wb") as console:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT
            )

    def wait(self, timeout: float) -> Boot:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        console = self.console_path.read_text(errors="replace")
        return Boot(self.kernel, self.out, console, time.monotonic() - self.started)

    def boot(self, timeout: float) -> Boot:
        """wait(), the guest killed whatever happens."""
        try:
            return self.wait(timeout)
        finally:
            self.kill()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@contextlib.contextmanager
def booted(
    kernel: Kernel,
    command: str,
    prepare: Callable[[Path], None],
    budget_s: float,
    memory_mb: int = 1024,
    switch_root: bool = False,
) -> Iterator[Boot]:
    """One guest booted to its end: `prepare(out)` first puts the command's input in its
    output directory (readable by every user of the guest); yields the Boot, the directory
    kept until the block ends."""
    with tempfile.TemporaryDirectory(prefix=f"execwatch-{kernel.release}-") as tmp:
        out = Path(tmp) / "vm" / "out"
        out.mkdir(parents=True)
        out.chmod(0o755)
        prepare(out)
        vm = Vm(kernel, command, out.parent, memory_mb=memory_mb, switch_root=switch_root)
        yield vm.boot(budget_s)
