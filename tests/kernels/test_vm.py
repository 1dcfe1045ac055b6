"""What the guest must bind back over its tmpfs: pure path logic (the guests prove the rest)."""

from __future__ import annotations

from pathlib import Path

from tests.support.kernels.vm import kept_paths


def test_a_clone_and_its_cache_under_tmp_are_both_kept(tmp_path: Path) -> None:
    repo, cache = tmp_path / "clone", tmp_path / "home" / ".cache" / "execwatch"
    repo.mkdir()
    cache.mkdir(parents=True)
    (repo / ".cache").symlink_to(cache)
    assert kept_paths(repo) == [repo, cache]


def test_a_cache_inside_a_kept_clone_is_not_bound_twice(tmp_path: Path) -> None:
    repo = tmp_path / "clone"
    (repo / ".cache").mkdir(parents=True)
    assert kept_paths(repo) == [repo]


def test_nothing_is_kept_outside_the_tmpfs() -> None:
    assert kept_paths(Path("/work/main")) == []
