"""Render the Helm chart with the real helm binary (dev/k8s-tools.sh builds it)."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "charts" / "execwatch"
KUSTOMIZE = REPO / "deploy" / "kustomize"
BASE = REPO / "deploy" / "base"
KUBE_VERSION = "1.30.0"

Doc = dict[str, Any]


def helm() -> Path:
    """The helm binary, or a loud failure naming the step that builds it."""
    d = Path(os.environ.get("EXECWATCH_K8S_BIN", REPO / ".cache" / "k8s-bin"))
    path = d / "helm"
    if not os.access(path, os.X_OK):
        raise FileNotFoundError(f"{path} missing: run dev/k8s-tools.sh (make test does)")
    return path


def run_helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(helm()), *args], capture_output=True, text=True, timeout=120)


def render(*sets: str, namespace: str = "execwatch") -> list[Doc]:
    """`helm template` with --set VALUE for each of `sets`; the documents, parsed."""
    argv = [
        "template",
        "execwatch",
        str(CHART),
        "--namespace",
        namespace,
        "--kube-version",
        KUBE_VERSION,
    ]
    for s in sets:
        argv += ["--set", s]
    out = run_helm(*argv)
    if out.returncode != 0:
        raise RuntimeError(f"helm template {' '.join(sets)} failed:\n{out.stderr}")
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def find(docs: list[Doc], kind: str, name: str | None = None) -> Doc:
    hits = [d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    assert len(hits) == 1, f"expected one {kind} {name or ''}, got {len(hits)}"
    return hits[0]


def kinds(docs: list[Doc]) -> set[str]:
    return {d["kind"] for d in docs}


def base_docs() -> list[Doc]:
    docs: list[Doc] = []
    for path in sorted(BASE.rglob("*.yaml")):
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return docs


def kustomize_docs(directory: Path = KUSTOMIZE) -> list[Doc]:
    """The documents a kustomization lists (resources only; no kustomize binary here)."""
    k = yaml.safe_load((directory / "kustomization.yaml").read_text())
    docs: list[Doc] = []
    for res in k["resources"]:
        docs.extend(d for d in yaml.safe_load_all((directory / res).read_text()) if d)
    return docs


def pod_spec(workload: Doc) -> Doc:
    spec: Doc = workload["spec"]["template"]["spec"]
    return spec


def cli_accepts(command: str, flag: str, value: float) -> bool:
    """Does `execwatch COMMAND FLAG=VALUE` parse (the real parser, as the pod runs it)?"""
    from execwatch.cli import build_parser

    text = str(int(value)) if float(value).is_integer() else repr(float(value))
    with contextlib.redirect_stderr(io.StringIO()):
        try:
            build_parser(command).parse_args([command, f"{flag}={text}"])
        except SystemExit:
            return False
    return True


def smallest_accepted(bounds: dict[str, Any]) -> float:
    """The least value a values.schema.json property accepts (an integer's, or a number's
    just above an exclusive minimum)."""
    if "exclusiveMinimum" in bounds:
        step = 1 if bounds.get("type") == "integer" else 0.001
        return float(bounds["exclusiveMinimum"]) + step
    return float(bounds["minimum"])
