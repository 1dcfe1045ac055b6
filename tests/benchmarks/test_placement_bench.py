"""benchmarks/placement_bench.py at a tiny size, so that it cannot rot: every figure is
there and every pod it gated was placed (none failed open)."""

from __future__ import annotations

from pathlib import Path

from benchmarks.placement_bench import parse, run, table

from tests.support.deploy.chart import helm
from tests.support.kube.apiserver import find_binaries
from tests.support.registry.registry_server import registry_binary

TINY = ["--creates", "8", "--first-seen", "1", "--burst", "6", "--htpasswd-burst", "2"]


def test_the_placement_benchmark_runs_at_a_tiny_size(tmp_path: Path) -> None:
    # a missing tool fails here, naming the step that builds it
    helm()
    find_binaries()
    registry_binary()
    result = run(parse(TINY), tmp_path)

    create = result["create"]
    assert create["creates_each"] == 8
    assert 0 < create["without_p50_ms"] <= create["without_p99_ms"]
    assert 0 < create["with_p50_ms"] <= create["with_p99_ms"]
    assert set(result["ungate"]) == {"token", "htpasswd"}
    for auth, pods in (("token", 6), ("htpasswd", 2)):
        figures = result["ungate"][auth]
        assert figures["first_seen"]["pods"] == figures["warm"]["pods"] == 1
        assert 0 < figures["warm"]["p50_s"] <= figures["warm"]["p99_s"]
        assert figures["burst"]["pods"] == pods
        assert figures["burst"]["events"] == {"Placed": pods}, auth
        assert figures["controller_peak_rss_mb"] > 0
    lines = table(result).splitlines()
    assert len(lines) == 4 + 5 * 2
    assert lines[3].startswith("added by the webhook")
