"""The CI jobs of docs/scan.md ("In CI"), run as written.

The two YAML blocks are read out of the doc, so an edit of the doc changes what runs here.
Each `run:` (GitHub) or `script:` line (GitLab) is run as the runner runs it: GitHub's
`bash --noprofile --norc -eo pipefail` per step, GitLab's one shell per job with
`set -eo pipefail`, in a workspace holding a `FROM scratch` Dockerfile and a program,
with the job's own env. The program is static (every step passes; it answers exit 0 to
`--version` only, so the report's `exit 0` proves the run's arguments) or linked against
glibc (its loader is missing: the scan step exits 1, the reports are still written and
uploaded). What stands in for the runner:

- the install spec (`EXECWATCH_SPEC`) is a wheel built from this checkout, installed by
  the doc's own `pip install` into a fresh venv whose dependencies are this checkout's
  (no index is reached);
- `actions/setup-python` is that venv, of the version the doc asks for; `actions/checkout`
  is the workspace;
- Docker (the runner's, or GitLab's `docker:dind` service) is a private dockerd,
  reached through DOCKER_HOST;
- the upload steps are checked for their inputs: the SARIF file they upload exists and
  has the structure of SARIF 2.1.0 (the repo holds no copy of the JSON schema), the
  JUnit report parses.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.test_image import build_wheel
from tests.support.binfmt.cbuild import compile_c
from tests.support.engines.dockerd import Dockerd

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "scan.md"
SHA = "3f2c9e1b7a5d4c6e8f0a1b2c3d4e5f60718293a4"
APP_C = (
    "#include <stdio.h>\n#include <string.h>\n"
    "int main(int argc, char **argv) {\n"
    '  if (argc > 1 && !strcmp(argv[1], "--version")) { puts("app 1.0"); return 0; }\n'
    "  return 3;\n}\n"
)
DOCKERFILE = 'FROM scratch\nCOPY app /app\nENTRYPOINT ["/app"]\n'
# The app as built: static (it starts), or dynamic against glibc in a FROM scratch image
# (its ELF loader is missing: the static check and the run both fail it).
LINKING = {"static": ("-static",), "glibc-dynamic": ()}
EXPRESSION = re.compile(r"\$\{\{\s*([^}]+?)\s*\}\}")
SARIF_LEVELS = {"none", "note", "warning", "error"}


def ci_section() -> str:
    text = DOC.read_text()
    start = text.index("\n## In CI\n")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def yaml_block(first_line: str) -> dict[str, Any]:
    """The ```yaml block of the CI section whose first line is `first_line`."""
    blocks = re.findall(r"^```yaml\n(.*?)^```", ci_section(), re.M | re.S)
    (block,) = [b for b in blocks if b.startswith(first_line + "\n")]
    doc: dict[str, Any] = yaml.safe_load(block)
    return doc


@dataclass(frozen=True)
class Runner:
    """What a runner gives a job: its workspace, a Python with pip, a Docker daemon."""

    workspace: Path
    venv: Path
    wheel: Path
    docker_host: str
    linking: str  # of the app: a key of LINKING

    def env(self, job_env: dict[str, str]) -> dict[str, str]:
        path = f"{self.venv / 'bin'}:{os.environ['PATH']}"
        return {**os.environ, "PATH": path, "DOCKER_HOST": self.docker_host, **job_env}

    def shell(self, script: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        """As both runners run a script: bash, -e, -o pipefail, in the workspace."""
        return subprocess.run(
            ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script],
            cwd=self.workspace,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )


@pytest.fixture(scope="module")
def dockerd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dockerd]:
    daemon = Dockerd(tmp_path_factory.mktemp("ci-dockerd"))
    daemon.start()
    try:
        yield daemon
    finally:
        daemon.stop()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This checkout as the wheel a release would publish."""
    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(params=sorted(LINKING))
def runner(request: pytest.FixtureRequest, tmp_path: Path, dockerd: Dockerd, wheel: Path) -> Runner:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    compile_c(workspace / "app", APP_C, "gcc", *LINKING[request.param])
    (workspace / "Dockerfile").write_text(DOCKERFILE)
    venv = tmp_path / "python"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    python = Path(sys.base_prefix) / "bin" / f"python{version}"
    subprocess.run([str(python), "-m", "venv", str(venv)], check=True, timeout=120)
    (site,) = venv.glob("lib/python3*/site-packages")
    # The dependencies pip would fetch, taken from this checkout's environment.
    deps = [p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]
    (site / "execwatch-deps.pth").write_text("\n".join(deps) + "\n")
    return Runner(workspace, venv, wheel, dockerd.host, request.param)


def github_expressions(value: str, known: dict[str, str]) -> str:
    def sub(m: re.Match[str]) -> str:
        assert m.group(1) in known, f"the test knows no value for ${{{{ {m.group(1)} }}}}"
        return known[m.group(1)]

    return EXPRESSION.sub(sub, value)


def check_sarif(path: Path) -> list[dict[str, Any]]:
    """The structure SARIF 2.1.0 and GitHub's upload require of what execwatch writes."""
    assert path.is_file(), f"{path.name} was not written"
    doc = json.loads(path.read_text())
    assert doc["version"] == "2.1.0"
    assert doc["$schema"].endswith("sarif-schema-2.1.0.json") or "sarif-2.1.0" in doc["$schema"]
    (run,) = doc["runs"]
    driver = run["tool"]["driver"]
    assert driver["name"] == "execwatch"
    rule_ids = [r["id"] for r in driver["rules"]]
    assert len(rule_ids) == len(set(rule_ids))
    assert run["results"], "no result: --run adds one per platform at least"
    for result in run["results"]:
        assert result["ruleId"] in rule_ids
        assert rule_ids[result["ruleIndex"]] == result["ruleId"]
        assert result["level"] in SARIF_LEVELS
        assert result["message"]["text"]
        for loc in result["locations"]:
            uri = loc["physicalLocation"]["artifactLocation"]["uri"]
            assert uri and not uri.startswith("/")
    assert [r for r in run["results"] if r["properties"]["source"] == "run"], "no run"
    results: list[dict[str, Any]] = run["results"]
    return results


def honest(runner: Runner) -> bool:
    return runner.linking == "static"


def check_verdict(runner: Runner, sarif: Path) -> None:
    """The honest app started and nothing failed; the broken one failed, statically and run."""
    results = check_sarif(sarif)
    errors = {(r["ruleId"], r["properties"]["source"]) for r in results if r["level"] == "error"}
    if honest(runner):
        assert not errors
        started = [r for r in results if r["ruleId"] == "run-started"]
        assert started and "exit 0" in started[0]["message"]["text"]
    else:
        assert errors == {("missing-interpreter", "static"), ("missing-interpreter", "run")}


def test_the_github_actions_job_runs_as_written(runner: Runner) -> None:
    workflow = yaml_block("# .github/workflows/image.yml")
    (job,) = workflow["jobs"].values()
    assert job["permissions"]["security-events"] == "write", "upload-sarif needs it"
    known = {"vars.EXECWATCH_SPEC": str(runner.wheel), "github.sha": SHA}
    job_env = {k: github_expressions(str(v), known) for k, v in job["env"].items()}
    env = runner.env(job_env)
    failed: list[str] = []
    uploads = []
    for step in job["steps"]:
        condition = step.get("if", "success()")
        assert condition in ("success()", "always()"), condition
        if failed and condition == "success()":
            continue  # as GitHub skips it
        if "run" in step:
            out = runner.shell(github_expressions(step["run"], known), env)
            if out.returncode != 0:
                failed.append(f"{step['name']}: exit {out.returncode}\n{out.stdout}{out.stderr}")
            continue
        action, _, _ = step["uses"].partition("@")
        inputs = step.get("with", {})
        if action == "actions/setup-python":
            version = f"{sys.version_info.major}.{sys.version_info.minor}"
            assert str(inputs["python-version"]) == version, "the venv stands in for it"
        elif action == "github/codeql-action/upload-sarif":
            assert condition == "always()", "a failing scan's SARIF is uploaded too"
            uploads.append(runner.workspace / inputs["sarif_file"])
        else:
            assert action == "actions/checkout" and not inputs, step
    if honest(runner):
        assert not failed, failed
    else:
        (failure,) = failed
        assert failure.startswith("Scan and start the entrypoint: exit 1"), failure
    (sarif,) = uploads
    check_verdict(runner, sarif)


def test_the_gitlab_ci_jobs_run_as_written(runner: Runner) -> None:
    pipeline = yaml_block("# .gitlab-ci.yml")
    stages = pipeline.pop("stages")
    jobs = sorted(pipeline.items(), key=lambda item: stages.index(item[1]["stage"]))
    predefined = {"CI_COMMIT_SHORT_SHA": SHA[:8], "EXECWATCH_SPEC": str(runner.wheel)}
    codes: dict[str, int] = {}
    for name, job in jobs:
        for needed in job.get("needs", []):
            assert codes.get(needed) == 0, f"{name} needs {needed}, which did not pass"
        variables = {k: str(v) for k, v in job.get("variables", {}).items()}
        out = runner.shell("\n".join(job["script"]), runner.env({**predefined, **variables}))
        codes[name] = out.returncode
        artifacts = job["artifacts"]
        if out.returncode == 0 or artifacts.get("when") == "always":
            for path in artifacts["paths"]:
                assert (runner.workspace / path).exists(), f"{name}: artifact {path} missing"
    assert codes == {"build-image": 0, "execwatch": 0 if honest(runner) else 1}
    check_verdict(runner, runner.workspace / "execwatch.sarif")
    scan = pipeline["execwatch"]["artifacts"]
    junit = ET.parse(runner.workspace / scan["reports"]["junit"]).getroot()
    (suite,) = junit.findall("testsuite")
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    if honest(runner):
        assert suite.get("failures") == "0", "the program started: nothing failed"
        assert "run: started: exit 0" in (cases["run-started"].findtext("system-out") or "")
    else:
        assert suite.get("failures") == "1"
        assert cases["missing-interpreter"].find("failure") is not None
