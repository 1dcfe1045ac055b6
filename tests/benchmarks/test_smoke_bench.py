"""benchmarks/smoke_bench.py at its smallest (one warm and one cold run of each), so that it
cannot rot: both tools start both images from the same archives, and every figure the
docs quote is in its result. No timing is asserted: the machine is shared."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.smoke_bench import BINFMT, PHASES, parse, run

QUICK = ["--repeat", "1", "--cold", "1"]


def positive(times: dict[str, Any], runs: int) -> bool:
    return len(times["runs_s"]) == runs and 0 < times["min_s"] <= times["median_s"]


def test_the_smoke_benchmark_times_both_tools_on_both_platforms(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)  # the scan drops to nobody as root and reads its archive here
    entries_before = sorted(p.name for p in BINFMT.iterdir())
    result = run(parse(QUICK), tmp_path)

    rows = {row["platform"]: row for row in result["platforms"]}
    assert set(rows) == {"linux/amd64", "linux/arm64"}
    assert (rows["linux/amd64"]["emulated"], rows["linux/arm64"]["emulated"]) == (False, True)
    for row in rows.values():
        for tool in ("execwatch", "execwatch_tmpfs", "docker"):
            assert positive(row[tool]["warm"], 1) and positive(row[tool]["cold"], 1), tool
        docker = row["docker"]
        for key in ("first_after_load", "load", "load_and_first_run"):
            assert positive(docker[key], 1), key
        for tool in ("execwatch", "execwatch_tmpfs"):
            spent = row[tool]["phases"]
            assert set(spent) == {*PHASES, "start-up and imports", "total in-process"}
            assert all(seconds > 0 for seconds in spent.values()), spent
            assert spent["total in-process"] > spent["static scan"] + spent["unpack"]
        assert row["execwatch"]["memory"]["tree_peak_rss_mb"] > 0
        assert row["execwatch"]["memory"]["largest_process_mb"] > 0
        memory = docker["memory"]
        # the daemons serve every run: the tree's peak holds at least them and the client
        assert 0 < memory["idle_daemons_mb"] < memory["tree_peak_rss_mb"]
        assert 0 < memory["client_mb"] < memory["tree_peak_rss_mb"]
        assert set(row["execwatch_over_docker"]) >= {"warm", "cold", "memory"}
        assert all(r > 0 for r in row["execwatch_over_docker"].values())
    assert (rows["linux/amd64"]["target"], rows["linux/arm64"]["target"]) == (1.0, 1.2)
    assert result["docker_version"]
    # the host's binfmt_misc table is left as it was found (unmounted here: empty)
    assert sorted(p.name for p in BINFMT.iterdir()) == entries_before
