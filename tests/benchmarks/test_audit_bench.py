"""benchmarks/audit_bench.py at a tiny size, so that it cannot rot: the cluster it builds
is read back by the real `execwatch audit`, cold then warm, with the same verdicts."""

from __future__ import annotations

from pathlib import Path

from benchmarks.audit_bench import parse, run

from tests.support.kube.apiserver import find_binaries
from tests.support.registry.registry_server import registry_binary

TINY = ["--nodes", "6", "--pods", "80", "--images", "12", "--namespaces", "2"]


def test_the_audit_benchmark_runs_at_a_tiny_size(tmp_path: Path) -> None:
    # a missing tool fails here, naming the step that builds it
    find_binaries()
    registry_binary()
    result = run(parse(TINY), tmp_path)

    assert (result["nodes"], result["pods"], result["images"]) == (6, 80, 12)
    cold, warm = result["cold"], result["warm"]
    # one workload per Deployment/StatefulSet with pods, 2 DaemonSets, and per namespace a
    # CronJob, a Deployment scaled to zero and a bare pod
    assert cold["workloads"] == warm["workloads"] > 2 + 3 * 2
    assert cold["scanned"] > 0 and cold["from_cache"] == 0
    assert warm["scanned"] == 0 and warm["from_cache"] >= cold["scanned"]
    assert cold["verdicts"] == warm["verdicts"]
    # a glibc binary on a musl base fails on amd64; a lying arm64 entry fails on arm64
    assert cold["verdicts"]["amd64"]["would-fail"] > 0
    assert cold["verdicts"]["arm64"]["would-fail"] > 0
    assert cold["verdicts"]["arm64"]["missing-platform"] > 0
    assert cold["exit_code"] == warm["exit_code"] == 1  # some would fail, none unchecked
    assert 0 < cold["peak_rss_mb"] <= cold["tree_peak_rss_mb"]
    assert result["warm_table_s"] > 0
