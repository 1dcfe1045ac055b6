"""The top-level command line: every command listed, each loading only what it needs."""

from __future__ import annotations

import subprocess
import sys

import pytest

from execwatch.cli import COMMANDS, build_parser, command_of


def test_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser(command_of(["--help"])).parse_args(["--help"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0
    assert all(f"    {name} " in out for name in COMMANDS)


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["scan", "/bin/true"], "scan"),
        (["--log-level", "debug", "trace", "--json"], "trace"),
        (["--log-level=warning", "agent"], "agent"),
        (["--version"], ""),
        (["--version", "--help"], None),
        ([], None),
    ],
)
def test_the_command_word_is_found_past_top_level_options(
    argv: list[str], command: str | None
) -> None:
    assert command_of(argv) == command


def test_scan_does_not_load_the_node_or_cluster_stack() -> None:
    probe = (
        "import sys; from execwatch.cli import main; code = main(['scan', '/bin/true']);"
        " heavy = [m for m in ('grpc', 'lightkube', 'kubernetes', 'prometheus_client',"
        " 'execwatch.attribution', 'execwatch.probe') if m in sys.modules];"
        " print(code, heavy)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert out.splitlines()[-1] == "0 []"


def test_an_unknown_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser(command_of(["scna"])).parse_args(["scna"])
    assert exit_.value.code == 2
    assert "invalid choice: 'scna'" in capsys.readouterr().err
