"""`execwatch scan ARCHIVE --run` loads only what a local image's scan and run need: no
registry client, no network or report stack it was not asked for. Each such module is
start-up time that every CI job's run pays (the run's time is measured against
`docker run`, benchmarks.smoke_bench)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.binfmt.cbuild import HELLO_C, compile_c
from tests.support.images.imagebuild import Image, file, oci_layout, tar_directory

NOT_FOR_A_LOCAL_ARCHIVE = (
    "requests", "urllib3", "httpx", "http.client", "http.cookiejar", "ssl", "email",
    "www_authenticate", "execwatch.scan.guard", "execwatch.scan.credential_helpers",
    "rich", "xml", "execwatch.scan.report.sarif", "execwatch.scan.report.junit",
    "lightkube", "kubernetes", "grpc", "prometheus_client", "yaml",
)  # fmt: skip

PROBE = """
import json, sys
from execwatch.cli import main
code = main(sys.argv[1:])
print(json.dumps([code, sorted(sys.modules)]), file=sys.stderr)
"""


def test_a_local_archive_run_loads_no_registry_or_report_stack(
    shared_dir: Path, tmp_path: Path
) -> None:
    program = compile_c(tmp_path / "hello", HELLO_C, "musl-gcc", "-static")
    layout = oci_layout(tmp_path / "img", [Image([[file("hello", program.read_bytes())]],
                                                 entrypoint=["/hello"])])  # fmt: skip
    archive = tar_directory(layout, shared_dir / "img.tar")
    argv = ["scan", str(archive), "--run", "--no-progress", "--format", "json",
            "-o", str(tmp_path / "report.json")]  # fmt: skip
    done = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True,
                          text=True, timeout=300, cwd="/")  # fmt: skip
    code, modules = json.loads(done.stderr.splitlines()[-1])
    report = json.loads((tmp_path / "report.json").read_text())
    assert code == 0, done.stderr
    assert [f["check"] for f in report["findings"] if f["source"] == "run"] == ["run-started"]
    loaded = [m for m in modules if m.split(".")[0] in NOT_FOR_A_LOCAL_ARCHIVE
              or m in NOT_FOR_A_LOCAL_ARCHIVE]  # fmt: skip
    assert loaded == []
