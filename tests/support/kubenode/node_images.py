"""The images the node runs, all made on this machine (there is no registry).

- execwatch: built from the real Containerfile by dev/images.sh (buildah, base images from
  Debian packages), saved as .cache/images/execwatch.tar under the chart's default name;
- the pod sandbox's pause image: runtime/containerd.py builds and imports it with containerd;
- the workloads of the second seed's story, one-layer OCI archives made here:
  web:v1 (a healthy busybox httpd), web:v2-arm64 (the same, with an arm64 entrypoint:
  exec format error), web:v2-musl (an alpine-like musl root whose entrypoint is a glibc
  binary: its ELF loader is missing), side:v1 (a healthy shell that execs an arm64
  binary every few seconds), web:v2-noshebang (its entrypoint /app/run.sh has no #!
  line: runc gives up on it), side:noshebang (a healthy shell that runs a script without
  #! every few seconds: busybox runs it itself).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from tests.support.deploy.chart import CHART, REPO
from tests.support.runtime.containerd import oci_archive
from tests.support.runtime.runc import FOREIGN_BUSYBOX, HOST_BUSYBOX

IMAGES = REPO / ".cache" / "images"
EXECWATCH_ARCHIVE = IMAGES / "execwatch.tar"
MUSL_LOADER = Path("/lib/x86_64-linux-musl/libc.so")
WEB_PORT = 8080

WEB_V1 = "docker.io/execwatch-test/web:v1"
WEB_V2_ARM64 = "docker.io/execwatch-test/web:v2-arm64"
WEB_V2_MUSL = "docker.io/execwatch-test/web:v2-musl"
SIDE = "docker.io/execwatch-test/side:v1"
SIDE_FOREIGN = "/opt/tools/report"  # the arm64 binary the side process keeps trying
WEB_V2_NOSHEBANG = "docker.io/execwatch-test/web:v2-noshebang"
SIDE_NOSHEBANG = "docker.io/execwatch-test/side:noshebang"
NOSHEBANG_ENTRYPOINT = "/app/run.sh"
SIDE_SCRIPT = "/opt/tools/plain"  # no #!: the side process's shell runs it

SERVER_C = '#include <stdio.h>\nint main(void) { puts("v2"); return 0; }\n'


def execwatch_image() -> str:
    """The name dev/images.sh gives the image: the chart's default, ghcr.io/...:<appVersion>."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    return f"{values['image']['repository']}:{chart['appVersion']}"


def require_execwatch_archive() -> Path:
    key = IMAGES / "execwatch.key"
    if not EXECWATCH_ARCHIVE.exists() or not key.exists():
        raise FileNotFoundError(
            f"{EXECWATCH_ARCHIVE} missing: run dev/images.sh (dev/setup.sh --test runs it)"
        )
    out = subprocess.run(["dev/images.sh", "--check"], cwd=REPO, capture_output=True, text=True)
    if out.returncode != 0:
        raise FileNotFoundError(f"{EXECWATCH_ARCHIVE} is stale: {out.stderr.strip()}")
    return EXECWATCH_ARCHIVE


def _busybox_applets() -> dict[str, str]:
    return {f"bin/{a}": "busybox" for a in ("sh", "sleep", "httpd", "echo", "cat", "true")}


def build_workloads(workdir: Path) -> list[Path]:
    """The workload images as OCI archives for `ctr images import`."""
    workdir.mkdir(parents=True, exist_ok=True)
    index = workdir / "index.html"
    index.write_text("v1\n")
    server = workdir / "server"
    src = workdir / "server.c"
    src.write_text(SERVER_C)
    # A glibc binary: its PT_INTERP is /lib64/ld-linux-x86-64.so.2, absent from a musl root.
    subprocess.run(["gcc", "-O2", "-o", str(server), str(src)], check=True)
    run_sh = workdir / "run.sh"  # no #! line: what its author meant never runs
    run_sh.write_text(f"exec /bin/busybox httpd -f -p {WEB_PORT} -h /www\n")
    plain = workdir / "plain"  # no #! line either: a shell runs it
    plain.write_text("echo ok\n")
    httpd = ["/bin/busybox", "httpd", "-f", "-p", str(WEB_PORT), "-h", "/www"]
    web = {"bin/busybox": HOST_BUSYBOX, "www/index.html": index}
    return [
        oci_archive(workdir / "web-v1.tar", WEB_V1, web, _busybox_applets(), httpd),
        oci_archive(
            workdir / "web-v2-arm64.tar",
            WEB_V2_ARM64,
            {**web, "bin/server": FOREIGN_BUSYBOX},
            _busybox_applets(),
            ["/bin/server", *httpd[1:]],
        ),
        oci_archive(
            workdir / "web-v2-musl.tar",
            WEB_V2_MUSL,
            {**web, "lib/ld-musl-x86_64.so.1": MUSL_LOADER, "usr/local/bin/server": server},
            _busybox_applets(),
            ["/usr/local/bin/server"],
        ),
        oci_archive(
            workdir / "web-v2-noshebang.tar",
            WEB_V2_NOSHEBANG,
            {**web, NOSHEBANG_ENTRYPOINT.lstrip("/"): run_sh},
            _busybox_applets(),
            [NOSHEBANG_ENTRYPOINT],
        ),
        oci_archive(
            workdir / "side-noshebang.tar",
            SIDE_NOSHEBANG,
            {"bin/busybox": HOST_BUSYBOX, SIDE_SCRIPT.lstrip("/"): plain},
            _busybox_applets(),
            ["/bin/sh", "-c", f"while true; do {SIDE_SCRIPT} >/dev/null; sleep 3; done"],
        ),
        oci_archive(
            workdir / "side.tar",
            SIDE,
            {"bin/busybox": HOST_BUSYBOX, SIDE_FOREIGN.lstrip("/"): FOREIGN_BUSYBOX},
            _busybox_applets(),
            ["/bin/sh", "-c", f"while true; do {SIDE_FOREIGN} >/dev/null 2>&1; sleep 3; done"],
        ),
    ]
