"""The `execwatch` command line."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from execwatch import __version__, cliargs, logs

# Options whose value may start with a dash: `scan --run-args --version`.
DASHED_VALUES = frozenset({"--run-args"})
# Each command's module, imported only when that command runs (or for --help): trace and
# the cluster commands pull in gRPC, the Kubernetes client and Prometheus, which cost a
# CI job's `execwatch scan` 0.3 s of start-up for nothing.
COMMANDS = {
    "trace": "execwatch.node.trace",
    "scan": "execwatch.scan.cli",
    "audit": "execwatch.audit.cli",
    "agent": "execwatch.agent.cli",
    "handler": "execwatch.handler.cli",
    "placement": "execwatch.placement.cli",
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser with every command, only with `command`'s module when it is known, or
    with none for "" (`execwatch --version`)."""
    parser = cliargs.Parser(
        prog="execwatch", description="Catch and explain binaries that fail to start."
    )
    parser.add_argument("--version", action="version", version=f"execwatch {__version__}")
    parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"]
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    modules = (
        [COMMANDS[command]] if command in COMMANDS else [] if command == "" else COMMANDS.values()
    )
    for name in dict.fromkeys(modules):
        importlib.import_module(name).add_parser(sub)
    return parser


def command_of(argv: Sequence[str]) -> str | None:
    """The command word in argv, skipping the top-level options before it."""
    words = iter(argv)
    for word in words:
        if word == "--log-level":
            next(words, None)
        elif not word.startswith("-"):
            return word
    return "" if "--version" in argv and not {"-h", "--help"} & set(argv) else None


def main(argv: list[str] | None = None) -> int:
    argv = cliargs.attach_values(sys.argv[1:] if argv is None else argv, DASHED_VALUES)
    args = build_parser(command_of(argv)).parse_args(argv)
    logs.configure(args.log_level)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
