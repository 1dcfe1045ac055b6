"""The container image, as far as it can be proven without a registry or a build engine.

No base image can be pulled here, so `Containerfile` itself is not built. What is built and
run instead, each step mirroring a stage of the Containerfile:
- the BPF object for amd64 AND arm64 with the Containerfile's own per-arch flags;
- the execwatch wheel (with the BPF object inside), installed into a fresh virtualenv at
  the image's path, /opt/execwatch;
- a root filesystem holding that virtualenv (Python and the shared libraries, libbpf1
  included, come from this Debian bookworm host, read-only, as the python:3.11-slim-bookworm
  base would provide them; the dependencies are this checkout's tested ones);
- runc containers from it: the image's entrypoint as the handler runs it (uid 65532,
  read-only root, no capabilities), and as the agent runs it (uid 0, read-only root, ONLY
  the DaemonSet's capabilities, the host PID namespace and the same read-only host
  mounts), where it must catch and diagnose a real failed exec of an arm64 binary made
  by a process outside the container.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from execwatch import __version__
from execwatch.probe import loader
from tests.support.deploy.chart import REPO, find, pod_spec, render

CONTAINERFILE = REPO / "Containerfile"
BPF_SRC = REPO / "src" / "execwatch" / "bpf"
HELLO_ARM64 = REPO / ".cache" / "foreign" / "arm64" / "root" / "usr" / "bin" / "hello"
VENV_IN_IMAGE = "/opt/execwatch"
DEPS_IN_IMAGE = "/opt/deps"
EM_BPF = 247


def stages() -> list[str]:
    return re.findall(r"^FROM .*$", CONTAINERFILE.read_text(), re.M)


def test_containerfile_is_multi_stage_and_multi_arch() -> None:
    text = CONTAINERFILE.read_text()
    froms = stages()
    assert len(froms) == 4
    # Arch-independent work runs on the build platform; the venv and runtime on the target.
    assert "--platform=$BUILDPLATFORM" in froms[0] and froms[0].endswith("AS bpf")
    assert "--platform=$BUILDPLATFORM" in froms[1] and froms[1].endswith("AS wheel")
    assert "--platform" not in froms[2] and "--platform" not in froms[3]
    assert "ARG TARGETARCH" in text and "-D__TARGET_ARCH_$arch" in text
    assert 'linux-libc-dev:$TARGETARCH"' in text
    runtime = text[text.rindex(froms[3] + "\n") :]
    assert "libbpf1" in runtime, "the runtime stage installs libbpf1"
    assert re.search(r"^USER 65532:65532$", runtime, re.M)
    assert 'ENTRYPOINT ["execwatch"]' in runtime


def test_chart_runs_the_handler_as_the_image_user_and_the_agent_as_root() -> None:
    docs = render()
    handler = pod_spec(find(docs, "Deployment"))
    agent = pod_spec(find(docs, "DaemonSet"))
    assert handler["securityContext"]["runAsUser"] == 65532
    assert agent["containers"][0]["securityContext"]["runAsUser"] == 0


def containerfile_arches() -> dict[str, tuple[str, str]]:
    """TARGETARCH -> (__TARGET_ARCH_ suffix, multiarch dir), read from the Containerfile."""
    table = re.findall(r"(\w+)\) arch=(\w+) multiarch=([\w-]+) ;;", CONTAINERFILE.read_text())
    return {t: (a, m) for t, a, m in table}


def compile_bpf(target: str, out: Path) -> bytes:
    """The Containerfile's clang command for TARGETARCH=`target`."""
    arch, multiarch = containerfile_arches()[target]
    include = f"/usr/include/{multiarch}"
    if not Path(include).is_dir():  # this host only has its own arch's <asm/types.h>,
        include = "/usr/include/x86_64-linux-gnu"  # the generic one on both arches
    subprocess.run(
        ["clang", "-g", "-O2", "-Wall", "-Werror", "-target", "bpf", f"-D__TARGET_ARCH_{arch}",
         f"-I{include}", f"-I{BPF_SRC}", "-c", str(BPF_SRC / "execwatch.bpf.c"), "-o", str(out)],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    return out.read_bytes()


def test_bpf_object_compiles_for_each_target_arch_and_differs(tmp_path: Path) -> None:
    objs = {t: compile_bpf(t, tmp_path / f"{t}.o") for t in ("amd64", "arm64")}
    for obj in objs.values():
        assert obj[:4] == b"\x7fELF"
        assert int.from_bytes(obj[18:20], "little") == EM_BPF
    # The per-arch build matters: pt_regs offsets differ between amd64 and arm64.
    assert objs["amd64"] != objs["arm64"]


# -- the image, assembled -------------------------------------------------------------------


def build_wheel(out: Path) -> Path:
    bpf_obj = BPF_SRC / "execwatch.bpf.o"
    assert bpf_obj.exists(), "run `make bpf` (dev/setup.sh does)"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(out), str(REPO)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = out.glob("execwatch-*.whl")
    return wheel


def assemble_rootfs(root: Path, wheel: Path) -> None:
    """The image's filesystem: /opt/execwatch venv; /usr (libbpf1, libc) from this host."""
    for d in ("usr", "proc", "dev", "sys", "tmp", "etc", "opt", DEPS_IN_IMAGE.lstrip("/")):
        (root / d).mkdir(parents=True, exist_ok=True)
    for link in ("bin", "lib", "lib64", "sbin"):  # Debian's merged /usr
        (root / link).symlink_to(f"usr/{link}")
    (root / "etc" / "passwd").write_text(
        "root:x:0:0::/root:/bin/false\nexecwatch:x:65532:65532::/nonexistent:/bin/false\n"
    )
    base = Path(sys.base_prefix)
    (root / base.relative_to("/")).mkdir(parents=True)
    venv = root / VENV_IN_IMAGE.lstrip("/")
    python = base / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    subprocess.run([str(python), "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
         "-q", "--no-deps", "--no-index", "--no-compile", str(wheel)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    # pip wrote the build-time path of the venv into the entrypoint's #!; in the image
    # the venv IS at /opt/execwatch.
    script = venv / "bin" / "execwatch"
    script.write_text(script.read_text().replace(str(venv), VENV_IN_IMAGE, 1))
    site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    (site / "site-packages" / "deps.pth").write_text(DEPS_IN_IMAGE + "\n")


def runc_config(root: Path, args: list[str], *, uid: int, caps: list[str],
                host_pid: bool, agent_mounts: bool,
                no_new_privs: bool = True) -> dict[str, Any]:  # fmt: skip
    base = str(Path(sys.base_prefix))
    site_packages = next(Path(sys.prefix).glob("lib/python3*/site-packages"))

    def bind(src: str, dst: str | None = None) -> dict[str, Any]:
        return {"destination": dst or src, "type": "bind", "source": src,
                "options": ["rbind", "ro", "nosuid", "nodev"]}  # fmt: skip

    mounts = [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
        {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "nodev", "size=16m"]},
        {"destination": "/sys", "type": "sysfs", "source": "sysfs",
         "options": ["nosuid", "noexec", "nodev", "ro"]},
        bind("/usr"),
        bind(base),
        bind(str(site_packages), DEPS_IN_IMAGE),
    ]  # fmt: skip
    if agent_mounts:  # exactly the DaemonSet's host paths, read-only
        mounts += [bind("/sys/kernel/tracing"), bind("/sys/kernel/btf"), bind("/sys/fs/cgroup")]
    cap_names = [f"CAP_{c}" for c in caps]
    namespaces = [{"type": t} for t in ("mount", "ipc", "uts", "network", "cgroup")]
    if not host_pid:
        namespaces.append({"type": "pid"})
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": uid, "gid": uid},
            "args": args,
            "env": [f"PATH={VENV_IN_IMAGE}/bin:/usr/local/bin:/usr/bin:/bin",
                    "PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1"],
            "cwd": "/",
            # As Kubernetes does: a non-root user gets the added capabilities in its
            # bounding set only (no ambient field), so they are gone after execve unless
            # the file run grants them.
            "capabilities": {k: cap_names for k in
                             ("bounding", "effective", "permitted", "inheritable", "ambient")}
            if uid == 0 else {"bounding": cap_names, "effective": [], "permitted": []},
            "noNewPrivileges": no_new_privs,
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 4096, "soft": 4096}],
        },
        "root": {"path": str(root), "readonly": True},
        "hostname": "execwatch-image-test",
        "mounts": mounts,
        "linux": {
            "namespaces": namespaces,
            "cgroupsPath": f"/execwatch-image-test-{uuid.uuid4().hex[:8]}",
            "maskedPaths": ["/proc/kcore", "/proc/keys", "/proc/timer_list", "/sys/firmware"],
            "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys",
                              "/proc/sysrq-trigger"],
        },
    }  # fmt: skip


class Image:
    def __init__(self, workdir: Path) -> None:
        if shutil.which("runc") is None:
            raise FileNotFoundError("runc missing: dev/setup.sh --test installs it")
        self.workdir = workdir
        self.root = workdir / "rootfs"
        assemble_rootfs(self.root, build_wheel(workdir / "dist"))

    def run(
        self, args: list[str], *, timeout: float = 60, **kw: Any
    ) -> subprocess.CompletedProcess[str]:
        bundle = self.workdir / f"bundle-{uuid.uuid4().hex[:8]}"
        bundle.mkdir()
        (bundle / "config.json").write_text(json.dumps(runc_config(self.root, args, **kw)))
        cid = f"execwatch-image-{uuid.uuid4().hex[:8]}"
        try:
            return subprocess.run(
                ["runc", "run", "--bundle", str(bundle), cid],
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        finally:
            subprocess.run(["runc", "delete", "--force", cid], capture_output=True, timeout=30)


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Image]:
    if os.geteuid() != 0:
        pytest.fail("the image tests start runc containers: run as root", pytrace=False)
    yield Image(tmp_path_factory.mktemp("image"))


HANDLER: dict[str, Any] = {"uid": 65532, "caps": [], "host_pid": False, "agent_mounts": False}


def test_entrypoint_prints_the_version_as_the_non_root_image_user(image: Image) -> None:
    out = image.run(["execwatch", "--version"], **HANDLER)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"execwatch {__version__}"


def test_the_image_runs_its_own_installed_package_not_the_checkout(image: Image) -> None:
    code = (
        "import execwatch.probe.loader as m, pathlib; print(m.__file__); "
        "pkg = pathlib.Path(m.__file__).parent.parent; "
        "print(sorted(p.name for p in pkg.glob('bpf/*.o')))"
    )
    out = image.run(["python", "-c", code], **HANDLER)
    assert out.returncode == 0, out.stderr
    path, objs = out.stdout.splitlines()
    assert path.startswith(f"{VENV_IN_IMAGE}/lib/")
    assert objs == "['execwatch.bpf.o']"


def test_root_filesystem_is_read_only_and_the_user_has_no_capabilities(image: Image) -> None:
    code = "import os; open('/opt/x','w')"
    out = image.run(["python", "-c", code], **HANDLER)
    assert out.returncode != 0 and "Read-only file system" in out.stderr
    out = image.run(["python", "-c", "print(open('/proc/self/status').read())"], **HANDLER)
    status = dict(line.split(":\t", 1) for line in out.stdout.splitlines() if ":\t" in line)
    assert status["CapEff"].strip() == "0000000000000000"
    assert status["Uid"].split()[0] == "65532"


CAP_BITS = {"DAC_READ_SEARCH": 2, "SYS_PTRACE": 19, "SYS_RESOURCE": 24, "PERFMON": 38, "BPF": 39}


def agent_caps() -> list[str]:
    """The DaemonSet's capabilities that this machine can grant at all.

    A sandbox may lack some in its own bounding set (this one lacks SYS_RESOURCE); only
    SYS_RESOURCE may be missing, and only on kernels with memcg_accounting (compat.bpf.h's
    table of kernel versions), which do not need it.
    """
    c = pod_spec(find(render(), "DaemonSet"))["containers"][0]
    caps: list[str] = c["securityContext"]["capabilities"]["add"]
    status = Path("/proc/self/status").read_text()
    bounding = int(re.search(r"^CapBnd:\s*([0-9a-f]+)$", status, re.M).group(1), 16)  # type: ignore[union-attr]
    missing = [cap for cap in caps if not bounding >> CAP_BITS[cap] & 1]
    assert set(missing) <= {"SYS_RESOURCE"}, f"this machine cannot grant {missing}"
    if missing:
        since = loader.KERNEL["memcg_accounting"].since
        assert loader.kernel_version(os.uname().release) >= loader.kernel_version(since), (
            f"SYS_RESOURCE is needed before {since}"
        )
    return [cap for cap in caps if cap not in missing]


def exec_foreign_until(stop: threading.Event) -> None:
    while not stop.is_set():
        pid = os.fork()
        if pid == 0:
            try:
                os.execv(str(HELLO_ARM64), [str(HELLO_ARM64)])
            finally:
                os._exit(127)
        os.waitpid(pid, 0)
        stop.wait(0.2)


def trace_during_foreign_execs(image: Image, **context: Any) -> subprocess.CompletedProcess[str]:
    """`execwatch trace` for 6 s in the agent's container (host PID, the DaemonSet's host
    mounts, the given uid and capabilities) while this host keeps failing an arm64 exec."""
    stop = threading.Event()
    t = threading.Thread(target=exec_foreign_until, args=(stop,), daemon=True)
    t.start()
    try:
        return image.run(
            ["execwatch", "trace", "--json", "--duration", "6", "--no-attribution"],
            host_pid=True,
            agent_mounts=True,
            timeout=90,
            **context,
        )
    finally:
        stop.set()
        t.join(timeout=5)


def test_agent_entrypoint_with_only_the_daemonset_capabilities_diagnoses_a_host_exec(
    image: Image,
) -> None:
    """The capability set of the chart is enough, on this kernel, to load the probe and
    to read a failing binary through /proc/PID/root of a process outside the container."""
    assert HELLO_ARM64.exists(), "run dev/fetch-foreign.sh"
    out = trace_during_foreign_execs(image, uid=0, caps=agent_caps())
    assert out.returncode == 0, out.stderr
    records = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    mine = [r for r in records if r["path"] == str(HELLO_ARM64)]
    assert mine, f"no record of {HELLO_ARM64}; got {len(records)} records\n{out.stderr[-2000:]}"
    assert mine[0]["reason"] == "ForeignArchitecture"
    assert mine[0]["binary_arch"] == "arm64"


def test_without_sys_ptrace_the_agent_cannot_read_the_binary(image: Image) -> None:
    """CAP_SYS_PTRACE is what makes diagnosis possible: without it, Undiagnosed."""
    caps = [c for c in agent_caps() if c != "SYS_PTRACE"]
    out = trace_during_foreign_execs(image, uid=0, caps=caps)
    assert out.returncode == 0, out.stderr
    mine = [json.loads(x) for x in out.stdout.splitlines() if str(HELLO_ARM64) in x]
    assert mine and {r["reason"] for r in mine} == {"Undiagnosed"}, mine[:2]


def test_wheel_carries_the_bpf_object_and_the_console_script(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        assert "execwatch/bpf/execwatch.bpf.o" in names
        (ep,) = [n for n in names if n.endswith("entry_points.txt")]
        entry = z.read(ep).decode()
    assert "execwatch = execwatch.cli:main" in entry
