"""Run `execwatch scan` the way the CLI does and read its JSON."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest

from execwatch.scan import cli


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="execwatch")
    cli.add_parser(parser.add_subparsers())
    args = parser.parse_args(["scan", "--no-progress", *argv])
    code: int = args.func(args)
    return code


def scan_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    code = run([*argv, "--format", "json"])
    out = capsys.readouterr().out
    doc: dict[str, Any] = json.loads(out) if out else {}
    return code, doc


def checks(doc: dict[str, Any]) -> set[tuple[str, str]]:
    """(check, path) of every finding."""
    return {(f["check"], f["path"]) for f in doc["findings"]}


def scan_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run a scan that must fail with exit 2; return its one-line error."""
    capsys.readouterr()
    code = run(list(argv))
    captured = capsys.readouterr()
    assert code == 2, captured.out
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("execwatch scan: error: ")
    return lines[0]
