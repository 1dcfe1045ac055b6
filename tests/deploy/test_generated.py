"""Generated artefacts are up to date with their one source (dev/gen-deploy.py)."""

from __future__ import annotations

import subprocess
import sys

import yaml

from tests.support.deploy.chart import CHART, KUSTOMIZE, REPO, kustomize_docs, render


def test_generated_files_are_up_to_date() -> None:
    out = subprocess.run(
        [sys.executable, str(REPO / "dev" / "gen-deploy.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr


def test_the_kustomize_base_is_the_chart_with_default_values() -> None:
    plain = kustomize_docs()
    rendered = render("plainManifests=true")
    key = lambda d: (d["kind"], d["metadata"]["name"])  # noqa: E731
    assert sorted(plain, key=key) == sorted(rendered, key=key)
    for doc in plain:
        labels = doc["metadata"].get("labels", {})
        assert (
            "helm.sh/chart" not in labels and labels["app.kubernetes.io/managed-by"] == "kustomize"
        )


def test_every_kustomize_file_is_listed_by_a_kustomization() -> None:
    listed = set()
    for k in KUSTOMIZE.rglob("kustomization.yaml"):
        doc = yaml.safe_load(k.read_text())
        listed |= {(k.parent / r).resolve() for r in doc["resources"]}
        listed |= {(k.parent / p["path"]).resolve() for p in doc.get("patches", [])}
        assert doc["kind"] == ("Kustomization" if k.parent == KUSTOMIZE else "Component")
    files = {p.resolve() for p in KUSTOMIZE.rglob("*.yaml") if p.name != "kustomization.yaml"}
    assert files == listed


def test_chart_files_are_copies_of_their_sources() -> None:
    files = CHART / "files"
    assert (files / "execwatch-rules.yaml").read_text() == (
        REPO / "deploy" / "prometheus" / "execwatch-rules.yaml"
    ).read_text()
    assert (files / "execwatch.json").read_text() == (
        REPO / "deploy" / "grafana" / "execwatch.json"
    ).read_text()
    assert yaml.safe_load((files / "crd.yaml").read_text()) == yaml.safe_load(
        (REPO / "deploy" / "base" / "crd.yaml").read_text()
    )
