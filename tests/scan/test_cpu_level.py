"""cpu-level: an executable, or a library it loads, needs an x86-64 level the nodes lack.

The programs are built here by gcc and musl-gcc (static) with `-Wl,-z,x86-64-v3`
(tests/support/binfmt/cbuild.py) into a root of this host's real glibc files. What the nodes have
comes from `--cpu-level`, else the amd64 platform's variant (an index entry
`linux/amd64/v2`), else plain amd64, which promises only the baseline: a warning, since
the level was never stated. A guest CPU
without v3 refuses the same programs for real (tests/kernels/test_cpu_level.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.binfmt.cbuild import build_level_programs
from tests.support.images.imagebuild import Image, oci_layout, tree
from tests.support.probe.debian_roots import glibc_root
from tests.support.scan.scan_cli import checks, run, scan_json

NEEDS, USES, STATIC = "/app/needs-v3", "/app/uses-v3-lib", "/app/static-v3"
REFUSED = {("cpu-level", NEEDS), ("cpu-level", USES), ("cpu-level", STATIC)}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    built = build_level_programs(tmp_path_factory.mktemp("level-bin"))
    return glibc_root(
        tmp_path_factory.mktemp("level-root"), {f"/app/{n}": p for n, p in built.items()}
    )


def severities(doc: dict[str, Any]) -> set[str]:
    return {f["severity"] for f in doc["findings"]}


def message(doc: dict[str, Any], path: str) -> str:
    [found] = [f["message"] for f in doc["findings"] if f["path"] == path]
    return str(found)


def test_nodes_stated_below_the_level(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, doc = scan_json(capsys, str(root), "--platform", "linux/amd64/v2")
    assert code == 1 and checks(doc) == REFUSED and severities(doc) == {"error"}
    assert message(doc, NEEDS).startswith("needs x86-64-v3, the nodes have x86-64-v2")
    assert "(/app/libv3.so)" in message(doc, USES)  # the program is baseline: its library
    assert message(doc, STATIC).startswith("needs x86-64-v3, the nodes")  # no loader at all
    code, doc = scan_json(capsys, str(root), "--cpu-level", "x86-64-v2")
    assert code == 1 and checks(doc) == REFUSED and severities(doc) == {"error"}


@pytest.mark.parametrize("nodes", [["--platform", "linux/amd64/v3"], ["--cpu-level", "v4"]])
def test_nodes_at_the_level(
    root: Path, capsys: pytest.CaptureFixture[str], nodes: list[str]
) -> None:
    code, doc = scan_json(capsys, str(root), *nodes)
    assert (code, doc["findings"]) == (0, [])


def test_plain_amd64_promises_only_the_baseline(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Debian's own files need the baseline (their note says so) and pass; ours warn."""
    code, doc = scan_json(capsys, str(root), "--platform", "linux/amd64")
    assert code == 0 and checks(doc) == REFUSED and severities(doc) == {"warning"}
    assert "promises only x86-64-baseline" in message(doc, NEEDS)
    code, _ = scan_json(capsys, str(root), "--platform", "linux/amd64", "--fail-on", "warning")
    assert code == 1


def test_each_platform_of_an_index_by_its_variant(
    root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    entries = tree(root)
    layout = oci_layout(
        tmp_path / "oci",
        [Image([entries], variant="v2"), Image([entries], variant="v3")],
    )
    code, doc = scan_json(capsys, str(layout))
    assert code == 1
    by_platform = {(f["platform"], f["check"], f["path"]) for f in doc["findings"]}
    assert by_platform == {("linux/amd64/v2", c, p) for c, p in REFUSED}


def test_a_bad_level_is_bad_input(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        run([str(root), "--cpu-level", "v5"])
    assert exc.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.endswith(
        "argument --cpu-level: invalid x86-64 level 'v5': expected x86-64-v1 ... x86-64-v4"
    )


def test_a_lone_file_is_checked_against_the_level(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lone = str(root / "app/needs-v3")
    code, doc = scan_json(capsys, lone, "--cpu-level", "x86-64-v2")
    assert code == 1 and checks(doc) == {("cpu-level", lone)}
    code, doc = scan_json(capsys, lone, "--cpu-level", "x86-64-v3")
    assert (code, doc["findings"]) == (0, [])
