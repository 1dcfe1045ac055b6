"""Reporters and exit codes: JSON fields, SARIF 2.1.0 shape, JUnit XML, the table, --fail-on."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from execwatch.scan.vocabulary import CHECK_DESCRIPTIONS, Check
from tests.support.binfmt.elfbuild import ElfSpec, build_elf
from tests.support.images.imagebuild import Image, file, oci_layout
from tests.support.scan.scan_cli import run


@pytest.fixture
def broken_layout(tmp_path: Path, foreign_root: Path) -> Path:
    """amd64 config; an arm64 entrypoint, a CRLF script and a missing #! interpreter."""
    arm = (foreign_root / "arm64/root/usr/bin/busybox").read_bytes()
    layer = [file("app/server", arm), file("app/dos.sh", b"#!/bin/sh\r\n"),
             file("app/tool.sh", b"#!/bin/zsh\n")]  # fmt: skip
    return oci_layout(tmp_path / "l", [Image([layer], entrypoint=["/app/server"])])


def output(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    capsys.readouterr()
    code = run(list(argv))
    return code, capsys.readouterr().out


def test_json_findings_have_the_documented_fields(
    capsys: pytest.CaptureFixture[str], broken_layout: Path
) -> None:
    code, out = output(capsys, str(broken_layout), "--format", "json")
    doc = json.loads(out)
    assert code == 1
    first = doc["findings"][0]
    (image,) = doc["images"]
    assert first == {
        "check": "arch-mismatch", "path": "/app/server", "platform": "linux/amd64",
        "severity": "error", "entrypoint": True, "source": "static",
        "message": "ELF for linux/arm64 cannot run on linux/amd64 (exec format error)",
        "image": {"source": image["source"], "platform": "linux/amd64",
                  "digest": image["digest"]},
    }  # fmt: skip
    assert image["digest"].startswith("sha256:")
    assert all("entrypoint" not in f for f in doc["findings"][1:])
    assert {f["check"] for f in doc["findings"]} == {
        "arch-mismatch", "shebang-crlf", "missing-shebang-interpreter",
    }  # fmt: skip


def test_sarif(capsys: pytest.CaptureFixture[str], broken_layout: Path) -> None:
    _, out = output(capsys, str(broken_layout), "--format", "sarif")
    doc = json.loads(out)
    assert doc["version"] == "2.1.0"
    (run_,) = doc["runs"]
    rules = run_["tool"]["driver"]["rules"]
    assert [r["id"] for r in rules] == [str(c) for c in Check]
    assert all(r["shortDescription"]["text"] == CHECK_DESCRIPTIONS[Check(r["id"])] for r in rules)
    results = run_["results"]
    assert len(results) == 4
    for r in results:
        assert rules[r["ruleIndex"]]["id"] == r["ruleId"]
        assert r["level"] == "error"
        uri = r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
        assert not uri.startswith("/")
    properties = results[0]["properties"]
    assert properties["platform"] == "linux/amd64" and properties["entrypoint"] is True
    assert properties["image"]["digest"].startswith("sha256:")


def test_junit(capsys: pytest.CaptureFixture[str], broken_layout: Path) -> None:
    _, out = output(capsys, str(broken_layout), "--format", "junit")
    root = ET.fromstring(out.split("?>", 1)[1])
    (suite,) = root.findall("testsuite")
    assert suite.get("tests") == str(len(Check)) and suite.get("failures") == "3"
    failed = {c.get("name"): c.find("failure") for c in suite.findall("testcase")}
    assert failed["arch-mismatch"] is not None
    arch = failed["arch-mismatch"]
    assert arch is not None and "/app/server (entrypoint)" in (arch.text or "")
    assert failed["missing-library"] is None


def test_table_marks_the_entrypoint_and_summarises(
    capsys: pytest.CaptureFixture[str], broken_layout: Path
) -> None:
    code, out = output(capsys, str(broken_layout))
    assert code == 1
    assert "★ /app/server" in out
    assert "entrypoint: /app/server" in out
    assert "summary: 4 error" in out


def test_fail_on_threshold(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    static = build_elf(ElfSpec(elf_type=2, interpreter=None, dynamic=False)).data
    clean = oci_layout(tmp_path / "clean", [Image([[file("bin/app", static)]])])
    assert output(capsys, str(clean), "--format", "json")[0] == 0
    assert output(capsys, str(clean), "--fail-on", "note")[0] == 0


def test_bad_platform_argument_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        run([".", "--platform", "linux//x"])
    assert exc.value.code == 2
    assert "invalid platform" in capsys.readouterr().err


def test_unknown_architecture_is_a_usage_error_not_a_finding(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exc:
        run(["/bin/true", "--platform", "linux/amd46"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith(
        "unknown architecture 'amd46' (386, amd64, arm, arm64, loong64, "
        "mips, mips64, mips64le, mipsle, ppc64, ppc64le, riscv64, s390x)"
    )
